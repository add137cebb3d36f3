package cli

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// metrics are a worker's Prometheus metrics, on a private registry (no global state, one set per
// run), counted by its workObserver. Claims, finishes and parks are counted from each cycle's
// service.Result; calls and their duration from each call's answer, as the loop timed it, so a call
// is counted even when the finish transaction fails afterwards.
type metrics struct {
	registry     *prometheus.Registry
	claims       *prometheus.CounterVec
	calls        *prometheus.CounterVec
	finishes     *prometheus.CounterVec
	parked       prometheus.Counter
	setAside     *prometheus.CounterVec
	rateLimited  *prometheus.CounterVec
	ratePaused   *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	// The server's standing (service.ServerStanding), read at start and every standingEvery.
	standbys       prometheus.Gauge
	waitsOnStandby prometheus.Gauge
	finishRetries  prometheus.Counter
	// Fleet-wide gauges (service.AlertGauges), read from the database at start and every gaugesEvery:
	// every worker exports the same values, so the alert rules take their max over workers.
	tasksParked        prometheus.Gauge
	oldestParked       prometheus.Gauge
	oldestDue          prometheus.Gauge
	lateAccepted       prometheus.Gauge
	tasksScheduled     prometheus.Gauge
	ratePausedFor      *prometheus.GaugeVec
	accountPausedFor   *prometheus.GaugeVec
	gaugesRefreshed    prometheus.Gauge
	lastClaim          prometheus.Gauge
	pausedChannelsSeen map[string]bool // the channels ratePausedFor has a series for
	accountPausedSeen  map[string]bool // the channels accountPausedFor has a series for
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_claims_total",
			Help: "Tasks claimed by this worker (including those settled at claim time without a call).",
		}, []string{"channel"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_calls_total",
			Help: "Channel calls made, by what they observed.",
		}, []string{"channel", "action", "outcome"}),
		finishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_finish_total",
			Help: "Completed cycles by result (SENT, PENDING, UNKNOWN, PARKED, FAILED, SUPPRESSED, STALE; UNRECORDED: the finish of that task failed, it is recovered after its lease; set-aside tasks are counted in notifier_set_aside_total only).",
		}, []string{"result"}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_parked_total",
			Help: "Tasks this worker parked for a human (notifier review).",
		}),
		setAside: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_set_aside_total",
			Help: "Tasks the database refused to claim for what their own rows hold, set aside so the rest of the queue flows (see the worker's error log and the task's last_error).",
		}, []string{"channel"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_rate_limited_total",
			Help: "Claims of a channel its rate limit held back: no token (its tasks were not looked at), or fewer tokens than tasks it could have called.",
		}, []string{"channel"}),
		ratePaused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_rate_paused_total",
			Help: "429 answers on a rate-limited channel that paused it for every worker (for its Retry-After, 1 s without one).",
		}, []string{"channel"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "notifier_call_duration_seconds",
			Help:    "Duration of channel calls, up to the client timeout.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"channel", "action"}),
		standbys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_database_standbys",
			Help: "Standbys replicating from the database server this worker writes to (pg_stat_replication).",
		}),
		waitsOnStandby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_database_commits_wait_for_standby",
			Help: "1 when a commit waits for a standby (synchronous replication), else 0. With standbys and 0, a failover may lose creates answered created=true and attempt rows (docs/operations.md#high-availability).",
		}),
		finishRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_finish_retries_total",
			Help: "Finishes sent again after a broken connection or a failover (a finish is idempotent; retried until the lease would run out).",
		}),
		tasksParked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_tasks_parked",
			Help: "Tasks parked for a human now, fleet-wide (notifier review; the same value from every worker).",
		}),
		oldestParked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_tasks_parked_oldest_age_seconds",
			Help: "How long the longest-waiting parked task has waited for a human, fleet-wide; 0 when none.",
		}),
		oldestDue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_tasks_due_oldest_age_seconds",
			Help: "How long the longest-waiting due task has waited to be claimed, fleet-wide (as notifier status's oldest_ready_seconds); 0 when none.",
		}),
		lateAccepted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_tasks_late_accepted",
			Help: "FAILED or SUPPRESSED tasks that a late answer or a receipt says were accepted after all, fleet-wide (as notifier status's late_accepted).",
		}),
		tasksScheduled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_tasks_scheduled",
			Help: "Tasks waiting for their send time (create --send-at, --delay), fleet-wide, as notifier status's scheduled: not due, so not overdue.",
		}),
		ratePausedFor: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_rate_limit_paused_seconds",
			Help: "Seconds left of a rate-limited channel's pause after a 429 (0 when not paused), per channel with a bucket, fleet-wide.",
		}, []string{"channel"}),
		accountPausedFor: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_channel_account_paused_seconds",
			Help: "Seconds since a channel was paused for every worker by an account state (ACCOUNT_REFUSED: a rejected credential, a paused sending account), fleet-wide; a series per paused channel only, gone when the pause ends. The cause is in notifier status and the worker's log.",
		}, []string{"channel"}),
		gaugesRefreshed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_fleet_gauges_refreshed_timestamp_seconds",
			Help: "When this worker last read the fleet-wide gauges from the database (Unix time): they are as old as this.",
		}),
		lastClaim: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_worker_last_claim_timestamp_seconds",
			Help: "When this worker's last claim succeeded, whether it found tasks or not (Unix time; 0 before the first).",
		}),
		pausedChannelsSeen: map[string]bool{},
		accountPausedSeen:  map[string]bool{},
	}
	m.registry.MustRegister(m.claims, m.calls, m.finishes, m.parked, m.setAside, m.rateLimited, m.ratePaused, m.callDuration,
		m.standbys, m.waitsOnStandby, m.finishRetries,
		m.tasksParked, m.oldestParked, m.oldestDue, m.lateAccepted, m.tasksScheduled, m.ratePausedFor, m.accountPausedFor, m.gaugesRefreshed, m.lastClaim,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// serving creates the per-channel series of the channels a worker serves, at 0: a series that
// appears only at its first event hides that event from increase() and rate(), which is what the
// alert rules on set-aside tasks and 429 pauses use; and the dashboard shows a channel before its
// first call.
func (m *metrics) serving(channels []string) {
	for _, ch := range channels {
		m.claims.WithLabelValues(ch)
		m.setAside.WithLabelValues(ch)
		m.rateLimited.WithLabelValues(ch)
		m.ratePaused.WithLabelValues(ch)
	}
	for _, kind := range []service.ResultKind{service.ResultSent, service.ResultPending, service.ResultUnknown,
		service.ResultParked, service.ResultFailed, service.ResultSuppressed, service.ResultStale, service.ResultUnrecorded} {
		m.finishes.WithLabelValues(string(kind))
	}
}

// onAlertGauges exports one reading of the fleet-wide gauges, read at now. A channel whose bucket is
// gone, or whose account pause ended, loses its series.
func (m *metrics) onAlertGauges(g service.AlertGauges, now time.Time) {
	m.tasksParked.Set(float64(g.Parked))
	m.oldestParked.Set(g.OldestParkedSeconds)
	m.oldestDue.Set(g.OldestDueSeconds)
	m.tasksScheduled.Set(float64(g.Scheduled))
	m.lateAccepted.Set(float64(g.LateAccepted))
	rateSeries := map[string]float64{}
	for _, b := range g.RateLimits {
		rateSeries[b.Channel] = b.PausedFor
	}
	m.pausedChannelsSeen = setChannelSeries(m.ratePausedFor, m.pausedChannelsSeen, rateSeries)
	accountSeries := map[string]float64{}
	for _, p := range g.ChannelPauses {
		accountSeries[p.Channel] = p.PausedFor
	}
	m.accountPausedSeen = setChannelSeries(m.accountPausedFor, m.accountPausedSeen, accountSeries)
	m.gaugesRefreshed.Set(float64(now.UnixNano()) / 1e9)
}

// setChannelSeries sets a per-channel gauge to values, deletes the series of the channels in seen
// that values no longer holds, and returns the channels it now has a series for.
func setChannelSeries(gauge *prometheus.GaugeVec, seen map[string]bool, values map[string]float64) map[string]bool {
	now := make(map[string]bool, len(values))
	for ch, v := range values {
		gauge.WithLabelValues(ch).Set(v)
		now[ch] = true
	}
	for ch := range seen {
		if !now[ch] {
			gauge.DeleteLabelValues(ch)
		}
	}
	return now
}

// onResult counts one completed cycle.
func (m *metrics) onResult(r service.Result) {
	if r.Kind == service.ResultNothing {
		return
	}
	if r.Kind == service.ResultSetAside { // locked by a claim, then left alone: not claimed
		m.setAside.WithLabelValues(r.Channel).Inc()
		return
	}
	m.claims.WithLabelValues(r.Channel).Inc()
	m.finishes.WithLabelValues(string(r.Kind)).Inc()
	if r.Kind == service.ResultParked {
		m.parked.Inc()
	}
}

// observeCall counts one call and its duration.
func (m *metrics) observeCall(channel string, action delivery.Action, outcome delivery.Outcome, d time.Duration) {
	m.calls.WithLabelValues(channel, string(action), string(outcome)).Inc()
	m.callDuration.WithLabelValues(channel, string(action)).Observe(d.Seconds())
}
