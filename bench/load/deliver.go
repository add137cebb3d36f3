package load

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/notifierhq/notifier/bench/pgbench"
	"github.com/notifierhq/notifier/bench/workload"
	"github.com/notifierhq/notifier/internal/cputime"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/worker"
)

// loopStats is what one worker loop did in a phase. Its loopObserver runs on the loop's own
// goroutine, one event at a time, so it needs no lock; it is read after the loop returned.
type loopStats struct {
	sent        int
	other       map[string]int // results other than SENT: retries (PENDING), UNKNOWN, STALE, ...
	claims      int            // claims that brought tasks (to call, or settled at claim)
	emptyClaims int
	claimTasks  int
	finishes    int
	answers     int             // answers the finishes recorded
	claimLat    []time.Duration // claims that brought tasks, alone or behind a finish (each timed alone)
	finishLat   []time.Duration
	callLat     []time.Duration // each call, as the worker timed it (service.CallEvent)
}

// deliverStats is what a deliver phase did, all loops together.
type deliverStats struct {
	loopStats
	seconds              float64
	clientCPU, serverCPU time.Duration // this process's and the server's (0: not measured)
}

// deliver runs every worker loop (worker.Run with shape's knobs) until target tasks are settled (SENT,
// or finally not sent), then stops them; a stopping loop records its calls in flight before it
// returns. The phase's time ends when the last task is settled. A claim or finish that fails stops the
// phase with its error: a figure taken while the database fails would measure the failure.
//
// The fakes answer the phase by the latency model from the first draw of each channel's stream, as
// they answer the River peer's one deliver phase: a phase that went on from the warm-up's draws would
// meet other answers than the peer it is compared with, and with a long tail the last answers decide
// when a run ends (on 100ms,0.8, seed 1, the ideal of a 1,024-call window is 9% higher on the draws
// after 4,000 warm-up sends than on the first ones: docs/benchmarks/2026-12-05-window-bound.md).
//
// hook, when not nil, is called with "start" just before the loops' connections are opened (the
// pools are empty then: mainRun's commits closed them), so that every backend the phase works on
// starts after the mark, and with "end" once the loops have returned (after the phase's figures are
// taken): the marks bracket the phase's database work, the loops' stopping included.
func (b *bench) deliver(ctx context.Context, label string, target int, shape worker.Config, hook workload.PhaseHook) (deliverStats, error) {
	var err error
	if b.samplers, err = b.cfg.Latency.Apply(b.push, b.sms); err != nil {
		return deliverStats{}, err
	}
	if hook != nil {
		if err := hook(ctx, "start"); err != nil {
			return deliverStats{}, err
		}
	}
	// Open every loop's connections first: connecting is not part of the figures.
	for _, l := range b.loops {
		if err := workload.WarmPool(ctx, l.pool, shape.Connections()); err != nil {
			return deliverStats{}, err
		}
	}
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		settled   atomic.Int64
		reached   = make(chan struct{})
		reachOnce sync.Once
		failed    = make(chan error, 1)
		wg        sync.WaitGroup
		stopping  atomic.Bool
	)
	fail := func(err error) {
		if !stopping.Load() {
			select {
			case failed <- err:
			default:
			}
		}
	}
	bar := startProgress(b.bar, label, target)
	per := make([]*loopStats, len(b.loops))
	started, cpu0, serverPhase := time.Now(), cputime.Process(), b.server.Start()
	for i, l := range b.loops {
		st := &loopStats{other: map[string]int{}}
		per[i] = st
		cfg := shape
		cfg.Logger = b.log.With("worker", l.name)
		cfg.Observer = loopObserver{st: st, name: l.name, fail: fail, settled: func() {
			bar.Add(1)
			if settled.Add(1) == int64(target) {
				reachOnce.Do(func() { close(reached) })
			}
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker.Run(ctx, l.d, cfg)
		}()
	}
	select {
	case <-reached:
	case err = <-failed:
	case <-ctx.Done():
		err = ctx.Err()
	}
	took, cpu, srv := time.Since(started), cputime.Process()-cpu0, serverPhase.End()
	stopping.Store(true)
	cancel()
	wg.Wait()
	bar.Done()
	if hook != nil && err == nil {
		err = hook(outer, "end")
	}

	st := deliverStats{loopStats: loopStats{other: map[string]int{}}, seconds: took.Seconds(), clientCPU: cpu, serverCPU: srv}
	for _, p := range per {
		st.add(p)
	}
	b.delivered += st.sent
	if err != nil {
		return st, fmt.Errorf("deliver: %d of %d tasks settled: %w", settled.Load(), target, err)
	}
	return st, nil
}

// loopObserver is one loop's service.Observer in a phase: it times the loop's claims, calls and
// finishes into st, counts its results, calls settled for each task settled for good, and fails the
// phase with a claim's or finish's error.
type loopObserver struct {
	service.NopObserver
	st      *loopStats
	name    string
	fail    func(error)
	settled func()
}

func (o loopObserver) Claimed(e service.ClaimEvent) {
	if e.Err != nil {
		o.fail(fmt.Errorf("%s: claim: %w", o.name, e.Err))
		return
	}
	if e.Tasks == 0 {
		o.st.emptyClaims++
		return
	}
	o.st.claims++
	o.st.claimTasks += e.Tasks
	o.st.claimLat = append(o.st.claimLat, e.Took)
}

func (o loopObserver) Called(e service.CallEvent) { o.st.callLat = append(o.st.callLat, e.Took) }

func (o loopObserver) Finished(e service.FinishEvent) {
	if e.Err != nil {
		o.fail(fmt.Errorf("%s: finish: %w", o.name, e.Err))
		return
	}
	o.st.finishes++
	o.st.answers += e.Tasks
	o.st.finishLat = append(o.st.finishLat, e.Took)
}

func (o loopObserver) Completed(r service.Result) {
	o.st.result(r)
	if terminal(r.Kind) {
		o.settled()
	}
}

// SetAside counts the task among the other results; it is not settled.
func (o loopObserver) SetAside(r service.Result) { o.st.result(r) }

func (st *loopStats) result(r service.Result) {
	if r.Kind == service.ResultSent {
		st.sent++
	} else {
		st.other[string(r.Kind)]++
	}
}

func (st *loopStats) add(o *loopStats) {
	st.sent += o.sent
	for k, v := range o.other {
		st.other[k] += v
	}
	st.claims += o.claims
	st.emptyClaims += o.emptyClaims
	st.claimTasks += o.claimTasks
	st.finishes += o.finishes
	st.answers += o.answers
	st.claimLat = append(st.claimLat, o.claimLat...)
	st.finishLat = append(st.finishLat, o.finishLat...)
	st.callLat = append(st.callLat, o.callLat...)
}

// cpuMSPerDelivery is the client's and the server's CPU milliseconds per task SENT (0 without any).
func (st deliverStats) cpuMSPerDelivery() (client, server float64) {
	if st.sent == 0 {
		return 0, 0
	}
	return pgbench.MSPer(st.clientCPU, st.sent), pgbench.MSPer(st.serverCPU, st.sent)
}

// fill sets the deliver phase's figures of the report.
func (st deliverStats) fill(rep *Report) {
	rep.Deliveries, rep.DeliverSeconds = st.sent, pgbench.Round3(st.seconds)
	rep.DeliveriesPerSec = pgbench.Round3(float64(st.sent) / st.seconds)
	rep.OtherResults = st.other
	rep.Claims, rep.EmptyClaims, rep.Finishes = st.claims, st.emptyClaims, st.finishes
	if st.claims > 0 {
		rep.TasksPerClaim = pgbench.Round3(float64(st.claimTasks) / float64(st.claims))
	}
	if st.finishes > 0 {
		rep.AnswersPerFinish = pgbench.Round3(float64(st.answers) / float64(st.finishes))
	}
	rep.ClaimMS, rep.FinishMS, rep.CallMS = percentiles(st.claimLat), percentiles(st.finishLat), percentiles(st.callLat)
	if st.seconds > 0 {
		var busy time.Duration
		for _, d := range st.callLat {
			busy += d
		}
		rep.AvgInFlight = math.Round(10*busy.Seconds()/st.seconds) / 10
	}
	client, server := st.cpuMSPerDelivery()
	rep.CPUMSPerDelivery, rep.ServerCPUMSPerDelivery = pgbench.Round3(client), pgbench.Round3(server)
}

// terminal reports whether a result settles a task for good (or for a human).
func terminal(k service.ResultKind) bool {
	switch k {
	case service.ResultSent, service.ResultFailed, service.ResultSuppressed, service.ResultParked:
		return true
	}
	return false
}
