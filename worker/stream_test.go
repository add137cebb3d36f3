package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// memDispatcher is an in-memory Dispatcher: due tasks are numbers, a call runs the test's answer
// function, and every claim and finish is recorded for the test to inspect.
type memDispatcher struct {
	mu          sync.Mutex
	due         []int64
	answer      func(a *service.Attempt) delivery.Observation
	claimErr    error
	finishErr   error     // every finish fails with it
	claims      []int     // limits asked for, in order
	finishes    [][]int64 // task ids of each finish, in order
	finishing   int       // finishes running now
	maxFinishes int       // most finishes that ran at once
	finishGate  chan struct{}
	calling     int // calls in flight now
	maxCalling  int // most calls in flight at once
	held        int // claimed and not yet finished
	maxHeld     int
	calledAfter []bool // per claim: was it made after the stop?
	stopped     bool
	settled     []service.Result // what the first claim settles without a call
}

func newMem(tasks int, answer func(a *service.Attempt) delivery.Observation) *memDispatcher {
	m := &memDispatcher{answer: answer}
	for i := range tasks {
		m.due = append(m.due, int64(i+1))
	}
	return m
}

func (m *memDispatcher) ClaimBatch(ctx context.Context, limit int) ([]*service.Attempt, []service.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.claims = append(m.claims, limit)
	m.calledAfter = append(m.calledAfter, m.stopped)
	if m.claimErr != nil {
		return nil, nil, m.claimErr
	}
	n := min(limit, len(m.due))
	var out []*service.Attempt
	for _, id := range m.due[:n] {
		out = append(out, &service.Attempt{TaskID: id, Channel: "push", No: 1, Token: "tok", Action: delivery.ActionSend})
	}
	m.due = m.due[n:]
	m.held += n
	m.maxHeld = max(m.maxHeld, m.held)
	settled := m.settled
	m.settled = nil
	return out, settled, nil
}

func (m *memDispatcher) Call(_ context.Context, a *service.Attempt) delivery.Observation {
	m.mu.Lock()
	m.calling++
	m.maxCalling = max(m.maxCalling, m.calling)
	m.mu.Unlock()
	obs := m.answer(a)
	m.mu.Lock()
	m.calling--
	m.mu.Unlock()
	return obs
}

func (m *memDispatcher) FinishBatch(_ context.Context, attempts []*service.Attempt, obs []delivery.Observation) ([]service.Result, error) {
	m.mu.Lock()
	m.finishing++
	m.maxFinishes = max(m.maxFinishes, m.finishing)
	gate := m.finishGate
	m.mu.Unlock()
	if gate != nil {
		<-gate
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.finishing--
	ids := make([]int64, len(attempts))
	results := make([]service.Result, len(attempts))
	for i, a := range attempts {
		ids[i] = a.TaskID
		results[i] = service.Result{Kind: service.ResultSent, TaskID: a.TaskID, Outcome: obs[i].Outcome}
	}
	m.finishes = append(m.finishes, ids)
	m.held -= len(attempts)
	if m.finishErr != nil {
		return nil, m.finishErr
	}
	return results, nil
}

func (m *memDispatcher) finishedIDs() map[int64]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[int64]int{}
	for _, f := range m.finishes {
		for _, id := range f {
			seen[id]++
		}
	}
	return seen
}

func accepted(*service.Attempt) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeAccepted}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runUntil runs the loop until cond holds, then stops it and waits.
func runUntil(t *testing.T, d Dispatcher, cfg Config, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, d, cfg)
		close(done)
	}()
	defer cancel() // also when the condition is not reached: the loop stops before the test ends
	testworld.Eventually(t, 20*time.Second, "the loop's condition", cond)
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the stop")
	}
}

// The window bounds the calls in flight and the tasks held, and claims refill it: every task is
// delivered exactly once, and a claim never asks for more than the room left.
func TestRunKeepsTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		m := newMem(500, func(*service.Attempt) delivery.Observation {
			time.Sleep(2 * time.Millisecond) // a channel that takes a moment
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})
		runUntil(t, m, Config{MaxInFlight: 16, Batch: 10, Logger: quiet, Poll: time.Millisecond},
			func() bool { return len(m.finishedIDs()) == 500 })
		seen := m.finishedIDs()
		for id := int64(1); id <= 500; id++ {
			is.Equal(seen[id], 1) // every task recorded once
		}
		is.True(m.maxCalling <= 16) // never more calls at once than the window
		is.True(m.maxHeld <= 32)    // nor more held than the window and as many answers waiting to be recorded
		is.True(m.maxCalling > 10)  // and the window is really used, beyond one claim's batch
		for _, limit := range m.claims {
			is.True(limit >= 1 && limit <= 10) // a claim asks for at most --batch, and at least one
		}
	})
}

// A slow call holds nobody hostage: while one call hangs, the others' answers are recorded and the
// window keeps being refilled. Before the streaming loop, a cycle waited for its slowest call.
func TestSlowCallDoesNotHoldOtherAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		release := make(chan struct{})
		m := newMem(100, func(a *service.Attempt) delivery.Observation {
			if a.TaskID == 1 {
				<-release // the first task's channel hangs
			}
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			Run(ctx, m, Config{MaxInFlight: 8, Batch: 8, Logger: quiet, Poll: time.Millisecond})
			close(done)
		}()
		testworld.Eventually(t, 20*time.Second, "99 tasks finished", func() bool { return len(m.finishedIDs()) == 99 })
		is.Equal(m.finishedIDs()[1], 0) // the hanging one is not recorded yet
		cancel()
		close(release)
		<-done
		is.Equal(m.finishedIDs()[1], 1) // and is recorded once it answers, on the way out
	})
}

// Answers that arrive while a finish runs are recorded together by the next one (group commit), and
// no more than Finishers finishes run at once.
func TestAnswersAreRecordedInGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		gate := make(chan struct{})
		m := newMem(40, accepted)
		m.finishGate = gate
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			Run(ctx, m, Config{MaxInFlight: 40, Batch: 40, Finishers: 1, FinishBatch: 100, Logger: quiet, Poll: time.Millisecond})
			close(done)
		}()
		testworld.Eventually(t, 20*time.Second, "the first finish running", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.finishing == 1 })
		synctest.Wait() // the other answers arrive meanwhile
		close(gate)
		testworld.Eventually(t, 20*time.Second, "40 tasks finished", func() bool { return len(m.finishedIDs()) == 40 })
		cancel()
		<-done
		is.Equal(m.maxFinishes, 1)    // one finish at a time
		is.True(len(m.finishes) <= 3) // 40 answers in a few groups, not 40 finishes
	})
}

// One worker with a window of one runs the per-task cycle: one call at a time, each answer recorded by
// a finish of its own.
func TestWindowOfOneRunsTheCyclePerTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		m := newMem(20, accepted)
		runUntil(t, m, Config{MaxInFlight: 1, Batch: 1, Finishers: 1, Logger: quiet, Poll: time.Millisecond},
			func() bool { return len(m.finishedIDs()) == 20 })
		is.Equal(m.maxCalling, 1)     // one call at a time
		is.Equal(len(m.finishes), 20) // one finish per task: nothing to group with
	})
}

// While other calls are in flight, an answer waits up to FinishDelay for others to share its finish:
// a window of answers coming in close together is recorded in a few statements, not one per answer.
func TestAnswersWaitBrieflyToShareAFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		var n sync.Mutex
		count := 0
		m := newMem(64, func(*service.Attempt) delivery.Observation {
			n.Lock()
			count++
			d := time.Duration(count%8) * 100 * time.Microsecond // answers spread over under a millisecond
			n.Unlock()
			time.Sleep(d)
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})
		runUntil(t, m, Config{MaxInFlight: 64, Batch: 64, FinishDelay: 20 * time.Millisecond, Logger: quiet, Poll: time.Millisecond},
			func() bool { return len(m.finishedIDs()) == 64 })
		is.True(len(m.finishes) <= 8) // 64 answers in a handful of finishes
	})
}

// On stop no task is claimed any more, and every call in flight is still recorded before Run returns.
func TestStopRecordsCallsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		var once sync.Once
		calling := make(chan struct{})
		release := make(chan struct{})
		m := newMem(100, func(*service.Attempt) delivery.Observation {
			once.Do(func() { close(calling) })
			<-release
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { Run(ctx, m, Config{MaxInFlight: 5, Batch: 5, Logger: quiet}); close(done) }()
		<-calling
		m.mu.Lock()
		m.stopped = true
		m.mu.Unlock()
		cancel()
		synctest.Wait() // everything Run does without the calls' answers is done
		select {
		case <-done:
			t.Fatal("Run returned with calls in flight")
		default:
		}
		close(release)
		<-done
		is.Equal(len(m.finishedIDs()), 5) // the five calls in flight are recorded
		for _, after := range m.calledAfter {
			is.True(!after) // nothing was claimed after the stop
		}
	})
}

// A failing database is logged once when it starts failing and once when it recovers; claims back off
// in between instead of spinning.
// claimClock is a memDispatcher that notes when each claim was made.
type claimClock struct {
	*memDispatcher
	at []time.Time
}

func (c *claimClock) ClaimBatch(ctx context.Context, limit int) ([]*service.Attempt, []service.Result, error) {
	c.mu.Lock()
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
	return c.memDispatcher.ClaimBatch(ctx, limit)
}

// gaps are the waits between the claims made so far.
func (c *claimClock) gaps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(c.at); i++ {
		out = append(out, c.at[i].Sub(c.at[i-1]))
	}
	return out
}

// TestClaimFailuresBackOff: while claims fail, the wait between them doubles from Poll up to
// MaxBackoff; once a claim succeeds, the loop delivers and polls at Poll again. One log line when the
// failures start, one when they end. In a synctest bubble, so the waits are measured exactly on its
// fake clock; each is spread (up to a quarter longer, never shorter), so each is held to its bounds,
// which the loop without backoff (every wait Poll) already misses at the second.
func TestClaimFailuresBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		var buf syncBuf
		m := &claimClock{memDispatcher: newMem(3, accepted)}
		m.claimErr = errors.New("connection refused")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			Run(ctx, m, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Poll: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
			close(done)
		}()
		stop := func() { cancel(); <-done }
		defer stop() // also when an assertion fails: the bubble ends only with its goroutines
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		failing := m.gaps()
		ms := time.Millisecond
		is.True(len(failing) >= 5) // 200 ms hold 6 or 7 waits of 5, 10, 20, 40, 40... ms spread
		for i, gap := range failing {
			base := min(5*ms<<i, 40*ms) // doubled from Poll, capped at MaxBackoff
			if !spreadOf(gap, base) {
				t.Fatalf("wait %d after a failed claim: %v, want %v spread (up to %v)", i, gap, base, base+base/4)
			}
		}

		m.mu.Lock()
		m.claimErr = nil
		m.mu.Unlock()
		testworld.Eventually(t, 20*time.Second, "the three tasks finished", func() bool { return len(m.finishedIDs()) >= 3 })
		time.Sleep(20 * ms) // a few empty claims
		synctest.Wait()
		after := m.gaps()[len(failing):]
		is.True(len(after) > 2)            // the loop went on claiming
		is.True(spreadOf(after[0], 40*ms)) // the first claim after the failures waited the backoff, and succeeded
		for _, gap := range after[2:] {
			is.True(spreadOf(gap, 5*ms)) // then empty claims poll at Poll: the backoff ended with the failures
		}
		log := buf.String()
		is.Equal(strings.Count(log, "cycles failing"), 1)   // one line when it starts
		is.Equal(strings.Count(log, "cycles recovered"), 1) // one when it ends
	})
}

// The connections a worker needs do not grow with its window: no connection is held during a call.
func TestConnectionsDoNotGrowWithTheWindow(t *testing.T) {
	is := is.New(t)
	is.Equal(Config{}.Connections(), 1+DefaultFinishers)                    // a claim and the finishers
	is.Equal(Config{MaxInFlight: 10_000}.Connections(), 1+DefaultFinishers) // whatever the window
	is.Equal(Config{MaxInFlight: 10_000, Finishers: 4}.Connections(), 5)    // the finishers count
	is.Equal(Config{MaxInFlight: 3, Batch: 64}.WithDefaults().Batch, 3)     // a claim never exceeds the window
}

// spreadOf says whether wait is base as spread lengthens it: never shorter, at most a quarter longer.
func spreadOf(wait, base time.Duration) bool { return base <= wait && wait <= base+base/4 }

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// busyClock is a memDispatcher that notes when each claim that found tasks was made, whether alone or
// behind a finish.
type busyClock struct {
	*memDispatcher
	at []time.Time
}

func (c *busyClock) note(n int) {
	if n > 0 {
		c.mu.Lock()
		c.at = append(c.at, time.Now())
		c.mu.Unlock()
	}
}

func (c *busyClock) ClaimBatch(ctx context.Context, limit int) ([]*service.Attempt, []service.Result, error) {
	attempts, settled, err := c.memDispatcher.ClaimBatch(ctx, limit)
	c.note(len(attempts))
	return attempts, settled, err
}

// While work is due and nothing fails, claims wait only for room in the window, never a backoff or a
// poll: a finish that succeeded, alone or with a claim behind it, does not slow the claims down. On the
// bubble's clock, calls take 1-5 ms and Poll is 100 ms, so any wait of Poll shows.
func TestSucceedingFinishesDoNotBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		var n sync.Mutex
		count := 0
		m := &busyClock{memDispatcher: newMem(300, func(*service.Attempt) delivery.Observation {
			n.Lock()
			count++
			d := time.Duration(1+count%5) * time.Millisecond
			n.Unlock()
			time.Sleep(d)
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})}
		runUntil(t, m, Config{MaxInFlight: 16, Batch: 4, Finishers: 2, FinishDelay: time.Millisecond, Logger: quiet,
			Poll: 100 * time.Millisecond, MaxBackoff: 10 * time.Second},
			func() bool { return len(m.finishedIDs()) == 300 })
		m.mu.Lock()
		defer m.mu.Unlock()
		is.True(len(m.at) >= 300/4) // every task was claimed, at most a batch at a time
		for i := 1; i < len(m.at); i++ {
			if gap := m.at[i].Sub(m.at[i-1]); gap >= 100*time.Millisecond {
				t.Fatalf("claim %d waited %v after the one before, with work due and nothing failing", i, gap)
			}
		}
	})
}

// firstFinishFails is a busyClock whose first finish fails, as a database dropping the connection
// would; later finishes succeed.
type firstFinishFails struct {
	*busyClock
	failedOnce bool
}

func (f *firstFinishFails) FinishBatch(ctx context.Context, attempts []*service.Attempt, obs []delivery.Observation) ([]service.Result, error) {
	results, err := f.memDispatcher.FinishBatch(ctx, attempts, obs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failedOnce {
		f.failedOnce = true
		return nil, errors.New("connection reset by peer")
	}
	return results, err
}

// A finish that carries a claim counts by its own result: after a failed one the next claim waits a
// backoff, after a successful one it does not. With a window of one, every answer's finish carries the
// next claim; calls take 1 ms on the bubble's clock and Poll is 50 ms, so a backoff shows. The first
// finish fails: the claim it carries goes out at once (it was sent before the failure was known), the
// claim after that waits Poll (spread), and the next finish succeeds and slows nothing. A loop that
// takes the carried finish's success for a failure, and its failure for a success, waits one claim
// later instead.
func TestFinishCarryingAClaimBacksOffOnlyWhenItFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		m := &firstFinishFails{busyClock: &busyClock{memDispatcher: newMem(4, func(*service.Attempt) delivery.Observation {
			time.Sleep(time.Millisecond)
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})}}
		poll := 50 * time.Millisecond
		runUntil(t, m, Config{MaxInFlight: 1, Batch: 1, Logger: quiet, Poll: poll, MaxBackoff: time.Second},
			func() bool { return len(m.finishedIDs()) == 4 })
		m.mu.Lock()
		defer m.mu.Unlock()
		is.Equal(len(m.at), 4) // one claim per task
		gaps := []time.Duration{m.at[1].Sub(m.at[0]), m.at[2].Sub(m.at[1]), m.at[3].Sub(m.at[2])}
		is.Equal(gaps[0], time.Millisecond) // claim 2 rode behind the failing finish: the call's time only
		if !spreadOf(gaps[1], poll) {
			t.Fatalf("claim 3, after the finish that failed: waited %v, want Poll %v spread (up to %v)", gaps[1], poll, poll+poll/4)
		}
		is.Equal(gaps[2], time.Millisecond) // claim 4 rode behind a finish that succeeded: no wait
	})
}
