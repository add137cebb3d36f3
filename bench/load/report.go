package load

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/notifierhq/notifier/bench/latency"
	"github.com/notifierhq/notifier/bench/pgbench"
)

// Latency is a pair of percentiles in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

type serverInfo struct {
	Version           string `json:"version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	PlanCacheMode     string `json:"plan_cache_mode"` // of the workers' connections, and pgbench's
}

// Report is what the bench prints: the table, or with --json this object.
type Report struct {
	Peer          string  `json:"peer"` // "notifier"; bench/river prints "river"
	Notifications int     `json:"notifications"`
	Channels      int     `json:"channels"`
	Tasks         int     `json:"tasks"`
	Workers       int     `json:"workers"` // worker loops
	MaxInFlight   int     `json:"max_in_flight"`
	Batch         int     `json:"batch"`
	Finishers     int     `json:"finishers"`
	Window        int     `json:"window"` // calls in flight at most, all loops: workers x max_in_flight
	Duplicates    float64 `json:"duplicates"`
	// The provider model of the fakes, and the retry rules a refused send meets.
	CallLatency     latency.Report `json:"call_latency"`
	SkipCalls       bool           `json:"skip_calls"`
	RetryBackoffMS  float64        `json:"retry_backoff_ms"`
	MaxAttempts     int            `json:"max_attempts"`
	PoolMaxConns    int            `json:"pool_max_conns"`    // all pools: creates and checks, and every loop's
	WorkerPoolConns int            `json:"worker_pool_conns"` // connections one loop uses at most (1 + finishers)
	Server          serverInfo     `json:"server"`
	CPUs            int            `json:"cpus"`
	LoadAvgStart    []float64      `json:"load_avg_start"`
	LoadAvgEnd      []float64      `json:"load_avg_end"`

	CreateCalls      int     `json:"create_calls"`
	Created          int     `json:"created"`
	DuplicateAnswers int     `json:"duplicate_answers"`
	CreateSeconds    float64 `json:"create_seconds"`
	CreatesPerSec    float64 `json:"creates_per_sec"`
	CreateCallMS     Latency `json:"create_call_ms"`
	WarmupDeliveries int     `json:"warmup_deliveries"` // before anything was measured, not in the figures

	Deliveries       int            `json:"deliveries"`
	DeliverSeconds   float64        `json:"deliver_seconds"`
	DeliveriesPerSec float64        `json:"deliveries_per_sec"`
	OtherResults     map[string]int `json:"other_results"` // e.g. PENDING: a refused send to retry
	// From the loop's hooks: claims that brought tasks (alone or behind a finish), empty ones, the
	// finishes, and how full they were.
	Claims           int     `json:"claims"`
	EmptyClaims      int     `json:"empty_claims"`
	TasksPerClaim    float64 `json:"tasks_per_claim"`
	Finishes         int     `json:"finishes"`
	AnswersPerFinish float64 `json:"answers_per_finish"`
	CreateToSentMS   Latency `json:"create_to_sent_ms"`
	ClaimMS          Latency `json:"claim_ms"`  // each claim timed alone
	FinishMS         Latency `json:"finish_ms"` // each finish timed alone
	CallMS           Latency `json:"call_ms"`   // each call as the worker timed it

	DBXactsPerDelivery float64 `json:"db_xacts_per_delivery"`
	// Rows the server wrote (inserted, updated, deleted) per delivery, and the share of updates that
	// were HOT (wrote no index entry), over the deliver phase.
	RowsWrittenPerDelivery float64 `json:"db_rows_written_per_delivery"`
	HOTUpdateShare         float64 `json:"hot_update_share"`
	// Autovacuum and autoanalyze runs that finished during the deliver phase: server work that the
	// server's CPU counts, in some rounds and not others.
	Autovacuums int64 `json:"autovacuums"`
	// Calls in flight on average over the deliver phase (the sum of the calls' durations over the
	// phase's length), against Window.
	AvgInFlight float64 `json:"avg_in_flight"`
	// The answers the deliver phase drew from the latency model (sends and queries; 0 when the model
	// answers at once without errors), and the window's bound (latency.WindowBound): the deliveries/s
	// of Window calls in flight, each slot refilled the moment its call answers, sending to the channels
	// in turn, against as many of the model's first answers as the phase had tasks. Only the providers'
	// answers take time there: no claim, no finish, no client. 0 when the model refuses sends or
	// answers at once, or with --skip-calls.
	CallSteps         int     `json:"call_steps,omitempty"`
	WindowBoundPerSec float64 `json:"window_bound_per_sec,omitempty"`
	CPUMSPerDelivery  float64 `json:"cpu_ms_per_delivery"`
	// The PostgreSQL server's CPU (all its processes) over the deliver phase, when it runs here.
	ServerCPUMSPerDelivery float64         `json:"server_cpu_ms_per_delivery,omitempty"`
	ServerCPUSkipped       string          `json:"server_cpu_skipped,omitempty"`
	PeakRSSMiB             float64         `json:"peak_rss_mib"`
	Sends                  int             `json:"sends"`    // requests the fakes received, refused ones included
	Outbound               int             `json:"outbound"` // messages they accepted: one per task
	History                *historyReport  `json:"history,omitempty"`
	Pgbench                *pgbench.Report `json:"pgbench,omitempty"`
	// --rounds: every pair of a Go deliver phase and pgbench (the first is the main run's), and the
	// median of their ratios.
	Rounds            []roundReport `json:"rounds,omitempty"`
	MedianGoVsPgbench float64       `json:"median_go_vs_pgbench,omitempty"`
	PgbenchSkipped    string        `json:"pgbench_skipped,omitempty"`
	Check             string        `json:"check"`
}

func (r *Report) printJSON(w io.Writer) error {
	if err := json.NewEncoder(w).Encode(r); err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	return nil
}

func (r *Report) print(w io.Writer) error {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("notifier bench: %d notifications x %d channels (push idempotent, sms queryable), %.0f%% duplicate creates\n",
		r.Notifications, r.Channels, 100*r.Duplicates)
	p("worker: %d loop(s) of worker.Run, --max-in-flight %d --batch %d --finishers %d (window %d calls); pools of %d connections in all\n",
		r.Workers, r.MaxInFlight, r.Batch, r.Finishers, r.Window, r.PoolMaxConns)
	if r.SkipCalls {
		p("calls: skipped (--skip-calls): every attempt recorded ACCEPTED at once (the database side alone)\n")
	} else {
		p("calls: %s (--call-latency %s --call-errors %g --seed %d); retries %s apart, doubling, %d attempts\n",
			describeModel(r.CallLatency), r.CallLatency.Spec, r.CallLatency.Errors, r.CallLatency.Seed,
			time.Duration(r.RetryBackoffMS*float64(time.Millisecond)), r.MaxAttempts)
	}
	p("PostgreSQL %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s, plan_cache_mode=%s; %d CPUs, load average %s at start, %s at end\n\n",
		r.Server.Version, r.Server.Fsync, r.Server.SynchronousCommit, r.Server.SharedBuffers, r.Server.PlanCacheMode, r.CPUs,
		fmtLoad(r.LoadAvgStart), fmtLoad(r.LoadAvgEnd))
	p("%-32s %10s %9s %11s\n", "phase", "count", "seconds", "per second")
	p("%-32s %10d %9.2f %11.0f   (%d created, %d answered created=false)\n", "create (calls)", r.CreateCalls, r.CreateSeconds, r.CreatesPerSec, r.Created, r.DuplicateAnswers)
	p("%-32s %10d %9.2f %11.0f\n", "deliver (tasks SENT)", r.Deliveries, r.DeliverSeconds, r.DeliveriesPerSec)
	if r.WarmupDeliveries > 0 {
		p("%-32s %10d   (created and delivered before these phases, not measured)\n", "warm-up (tasks SENT)", r.WarmupDeliveries)
	}
	if len(r.OtherResults) > 0 {
		p("  other results on the way: %v\n", r.OtherResults)
	}
	p("\n%-32s %10s %9s\n", "latency (ms)", "p50", "p99")
	p("%-32s %10.2f %9.2f\n", "create -> SENT", r.CreateToSentMS.P50, r.CreateToSentMS.P99)
	p("%-32s %10.2f %9.2f\n", "create call", r.CreateCallMS.P50, r.CreateCallMS.P99)
	p("%-32s %10.2f %9.2f   (%d with tasks, %.1f tasks each; %d empty)\n", "claim", r.ClaimMS.P50, r.ClaimMS.P99,
		r.Claims, r.TasksPerClaim, r.EmptyClaims)
	p("%-32s %10.2f %9.2f   (%d, %.1f answers each)\n", "finish", r.FinishMS.P50, r.FinishMS.P99, r.Finishes, r.AnswersPerFinish)
	p("%-32s %10.2f %9.2f   (as the worker timed each call)\n", "channel call", r.CallMS.P50, r.CallMS.P99)
	p("\n%-32s %10.3f   (xact_commit delta over the deliver phase / deliveries)\n", "db transactions per delivery", r.DBXactsPerDelivery)
	p("%-32s %10.3f   (tup_inserted+updated+deleted delta / deliveries; %.0f%% of updates HOT)\n", "db rows written per delivery",
		r.RowsWrittenPerDelivery, 100*r.HOTUpdateShare)
	p("%-32s %10.1f   (of a window of %d)\n", "calls in flight on average", r.AvgInFlight, r.Window)
	if r.WindowBoundPerSec > 0 {
		p("%-32s %10.0f   (deliveries/s of the window refilled at once against the same answers: %.0f%% reached)\n",
			"window bound", r.WindowBoundPerSec, 100*r.DeliveriesPerSec/r.WindowBoundPerSec)
	}
	p("%-32s %10.3f   (this process: workers, fakes and HTTP on both sides)\n", "client CPU ms per delivery", r.CPUMSPerDelivery)
	if r.ServerCPUSkipped == "" {
		p("%-32s %10.3f   (all PostgreSQL processes, from /proc)\n", "server CPU ms per delivery", r.ServerCPUMSPerDelivery)
	} else {
		p("%-32s %10s   (%s)\n", "server CPU ms per delivery", "-", r.ServerCPUSkipped)
	}
	p("%-32s %10.1f   (VmHWM of this process; the workers and the fakes run in it)\n", "peak RSS MiB", r.PeakRSSMiB)
	p("%-32s %10d   (%d messages accepted)\n", "sends to the fakes", r.Sends, r.Outbound)
	if h := r.History; h != nil {
		p("\nclaim latency vs history (a fresh probe of %d due tasks each time, %d loop(s) per task; the seed's claim\n", h.Before.Tasks, r.Workers)
		p("query %d times in a rolled-back transaction, as planned here and as on the seed's indexes)\n", h.Before.SeedRuns)
		p("%-24s %14s %14s %18s %18s\n", "p50 ms", "finished tasks", "claim", "seed claim", "seed on its indexes")
		p("%-24s %14d %14.3f %18.3f %18.3f\n", "before", h.Before.FinishedTasks, h.Before.ClaimMS.P50, h.Before.SeedClaimMS.P50, h.Before.SeedClaimSeedIndexesMS.P50)
		p("%-24s %14d %14.3f %18.3f %18.3f\n", fmt.Sprintf("after +%d", h.Rows), h.After.FinishedTasks, h.After.ClaimMS.P50, h.After.SeedClaimMS.P50, h.After.SeedClaimSeedIndexesMS.P50)
		p("%-24s %14s %14.2f %18.2f %18.2f\n", "ratio after / before", "", h.ClaimP50Ratio, h.SeedClaimP50Ratio, h.SeedClaimSeedIndexesP50Ratio)
		p("(history of %d finished tasks filled in %.1fs; VACUUM (ANALYZE) before each probe; load average %s, then %s)\n",
			h.Rows, h.FillSeconds, fmtLoad(h.Before.LoadAvg), fmtLoad(h.After.LoadAvg))
	}
	if g := r.Pgbench; g != nil {
		p("\npgbench %s (-M prepared, plan_cache_mode=%s): %d clients, %d threads, %d deliveries: %.0f tps, latency avg %.2f ms\n",
			g.Script, r.Server.PlanCacheMode, g.Clients, g.Threads, g.Transactions, g.TPS, g.LatencyAvgMS)
		p("CPU ms per delivery: pgbench %.3f", g.ClientCPUMSPerDelivery)
		if r.ServerCPUSkipped == "" {
			p(", server %.3f (Go side: client %.3f, server %.3f)", g.ServerCPUMSPerDelivery, r.CPUMSPerDelivery, r.ServerCPUMSPerDelivery)
		}
		p("\n")
		p("Go deliveries/s (%d loop(s), --max-in-flight %d --batch %d) / pgbench tps (per task, %d clients) = %.0f / %.0f = %.2f\n",
			r.Workers, r.MaxInFlight, r.Batch, g.Clients, r.DeliveriesPerSec, g.TPS, g.GoVsPgbench)
		if len(r.Rounds) > 0 {
			p("\n%-6s %16s %12s %13s %22s %22s\n", "round", "Go deliveries/s", "pgbench tps", "Go / pgbench", "Go CPU ms client/srv", "pgbench CPU ms cl/srv")
			for _, x := range r.Rounds {
				p("%-6d %16.0f %12.0f %13.2f %15.3f/%.3f %15.3f/%.3f\n", x.Round, x.DeliveriesPerSec, x.PgbenchTPS, x.GoVsPgbench,
					x.CPUMSPerDelivery, x.ServerCPUMSPerDelivery, x.PgbenchCPUMSPerDelivery, x.PgbenchServerCPUMSPerDelivery)
			}
			p("median Go / pgbench over %d rounds = %.2f\n", len(r.Rounds), r.MedianGoVsPgbench)
		}
	} else if r.PgbenchSkipped != "" {
		p("\npgbench: skipped (%s)\n", r.PgbenchSkipped)
	}
	p("\ncheck: %s\n", r.Check)
	_, err := io.WriteString(w, sb.String())
	return err
}

// describeModel is a latency.Report in words.
func describeModel(m latency.Report) string {
	s := "answered at once"
	if m.MedianMS > 0 {
		s = fmt.Sprintf("lognormal latency, median %.4g ms, sigma %g (p90 %.0f ms, p99 %.0f ms)", m.MedianMS, m.Sigma, m.P90MS, m.P99MS)
	}
	if m.Errors > 0 {
		s += fmt.Sprintf(", %g%% of sends answered 503 before acceptance", 100*m.Errors)
	}
	return s
}

func fmtLoad(l []float64) string {
	if len(l) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", l[0])
}

// percentiles gives p50 and p99 (nearest rank) in milliseconds.
func percentiles(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return pgbench.Round3(float64(s[max(0, min(i, len(s)-1))]) / float64(time.Millisecond))
	}
	return Latency{P50: at(0.50), P99: at(0.99)}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return pgbench.Round3(a / b)
}
