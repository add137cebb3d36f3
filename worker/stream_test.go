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
	"time"

	"github.com/matryer/is"

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
	carried     int    // finishes that carried the next claim
	stopped     bool
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
	return out, nil, nil
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

func (m *memDispatcher) FinishBatchThenClaim(ctx context.Context, attempts []*service.Attempt, obs []delivery.Observation, limit int) service.Handoff {
	m.mu.Lock()
	m.carried++
	m.mu.Unlock()
	var h service.Handoff
	h.Finished, h.FinishErr = m.FinishBatch(ctx, attempts, obs)
	h.Next, h.Settled, h.ClaimErr = m.ClaimBatch(ctx, limit)
	return h
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

// runUntil runs the loop until cond holds (checked every millisecond), then stops it and waits.
func runUntil(t *testing.T, d Dispatcher, cfg Config, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, d, cfg)
		close(done)
	}()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-deadline:
			cancel()
			t.Fatal("condition not reached")
		case <-time.After(time.Millisecond):
		}
	}
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
}

// A slow call holds nobody hostage: while one call hangs, the others' answers are recorded and the
// window keeps being refilled. Before the streaming loop, a cycle waited for its slowest call.
func TestSlowCallDoesNotHoldOtherAnswers(t *testing.T) {
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
	waitCond(t, func() bool { return len(m.finishedIDs()) == 99 })
	is.Equal(m.finishedIDs()[1], 0) // the hanging one is not recorded yet
	cancel()
	close(release)
	<-done
	is.Equal(m.finishedIDs()[1], 1) // and is recorded once it answers, on the way out
}

// Answers that arrive while a finish runs are recorded together by the next one (group commit), and
// no more than Finishers finishes run at once.
func TestAnswersAreRecordedInGroups(t *testing.T) {
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
	waitCond(t, func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.finishing == 1 }) // the first finish is running
	time.Sleep(20 * time.Millisecond)                                                      // the other answers arrive meanwhile
	close(gate)
	waitCond(t, func() bool { return len(m.finishedIDs()) == 40 })
	cancel()
	<-done
	is.Equal(m.maxFinishes, 1)    // one finish at a time
	is.True(len(m.finishes) <= 3) // 40 answers in a few groups, not 40 finishes
}

// One worker with a window of one runs the per-task cycle in two round trips: every finish but the
// last carries the next claim (the bench found none did when the window was full).
func TestWindowOfOneCarriesTheClaimWithTheFinish(t *testing.T) {
	is := is.New(t)
	m := newMem(20, accepted)
	runUntil(t, m, Config{MaxInFlight: 1, Batch: 1, Finishers: 1, Logger: quiet, Poll: time.Millisecond},
		func() bool { return len(m.finishedIDs()) == 20 })
	is.Equal(m.maxCalling, 1)     // one call at a time
	is.True(m.carried >= 19)      // each finish brought the next claim with it
	is.Equal(len(m.finishes), 20) // one finish per task: nothing to group with
}

// While other calls are in flight, an answer waits up to FinishDelay for others to share its finish:
// a window of answers coming in close together is recorded in a few statements, not one per answer.
func TestAnswersWaitBrieflyToShareAFinish(t *testing.T) {
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
}

// On stop no task is claimed any more, and every call in flight is still recorded before Run returns.
func TestStopRecordsCallsInFlight(t *testing.T) {
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
	select {
	case <-done:
		t.Fatal("Run returned with calls in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-done
	is.Equal(len(m.finishedIDs()), 5) // the five calls in flight are recorded
	for _, after := range m.calledAfter {
		is.True(!after) // nothing was claimed after the stop
	}
}

// A failing database is logged once when it starts failing and once when it recovers; claims back off
// in between instead of spinning.
func TestClaimFailuresBackOff(t *testing.T) {
	is := is.New(t)
	var buf syncBuf
	m := newMem(3, accepted)
	m.claimErr = errors.New("connection refused")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, m, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Poll: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		close(done)
	}()
	time.Sleep(200 * time.Millisecond)
	m.mu.Lock()
	tries := len(m.claims)
	m.claimErr = nil
	m.mu.Unlock()
	waitCond(t, func() bool { return len(m.finishedIDs()) == 3 })
	cancel()
	<-done
	is.True(tries >= 3 && tries <= 40) // retried, with backoff (200 ms at 5-20 ms apart), not spinning
	log := buf.String()
	is.Equal(strings.Count(log, "cycles failing"), 1)   // one line when it starts
	is.Equal(strings.Count(log, "cycles recovered"), 1) // one when it ends
}

// The connections a worker needs do not grow with its window: no connection is held during a call.
func TestConnectionsDoNotGrowWithTheWindow(t *testing.T) {
	is := is.New(t)
	is.Equal(Config{}.Connections(), 1+DefaultFinishers)                    // a claim and the finishers
	is.Equal(Config{MaxInFlight: 10_000}.Connections(), 1+DefaultFinishers) // whatever the window
	is.Equal(Config{MaxInFlight: 10_000, Finishers: 4}.Connections(), 5)    // the finishers count
	is.Equal(Config{MaxInFlight: 3, Batch: 64}.WithDefaults().Batch, 3)     // a claim never exceeds the window
}

func waitCond(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

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
