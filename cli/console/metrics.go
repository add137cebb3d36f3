package console

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are a console's Prometheus metrics, on a private registry (notifier console --metrics-addr):
// what operators did through it and what it refused. The fleet's gauges (parked tasks, the oldest due
// task) are the workers' to export: every console would only repeat them.
type metrics struct {
	registry *prometheus.Registry
	resolves *prometheus.CounterVec
	signIns  *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		resolves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_console_resolves_total",
			Help: "Resolves posted through the console, by the state asked for and what came of it: resolved, unchanged (already resolved or not parked), invalid (no note, a bad state), error (the database failed).",
		}, []string{"state", "result"}),
		signIns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_console_sign_ins_total",
			Help: "Password sign-ins by result: ok, wrong_password (or unknown user), rate_limited (too many failures for that user from that address), rate_limited_address (too many attempts from that address), rate_limited_global (too many attempts from all addresses): the last two ran no bcrypt.",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_console_refused_total",
			Help: "Requests refused before any handler work, by reason: csrf (a form without the session's token), untrusted_proxy (a request not from a --trusted-proxy, or without its user header), too_large (a body over 64 KiB).",
		}, []string{"reason"}),
	}
	for _, state := range []string{"SENT", "FAILED"} {
		for _, result := range []string{"resolved", "unchanged", "invalid", "error"} {
			m.resolves.WithLabelValues(state, result)
		}
	}
	for _, result := range []string{"ok", "wrong_password", "rate_limited", "rate_limited_address", "rate_limited_global"} {
		m.signIns.WithLabelValues(result)
	}
	for _, reason := range []string{"csrf", "untrusted_proxy", "too_large"} {
		m.refused.WithLabelValues(reason)
	}
	m.registry.MustRegister(m.resolves, m.signIns, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry holds the console's metrics, for a /metrics handler.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.registry }
