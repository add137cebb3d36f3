package worker

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// recorder is a service.Observer that notes what the loop reported. The loop reports on its own
// goroutine, one event at a time, and the test reads it after Run returned: no lock.
type recorder struct {
	service.NopObserver
	claimed   []service.ClaimEvent
	called    map[int64]time.Duration // task: call duration
	actions   []delivery.Action
	finished  []service.FinishEvent
	completed map[int64]service.ResultKind
	setAside  []int64
}

func newRecorder() *recorder {
	return &recorder{called: map[int64]time.Duration{}, completed: map[int64]service.ResultKind{}}
}

func (r *recorder) Claimed(e service.ClaimEvent) { r.claimed = append(r.claimed, e) }
func (r *recorder) Called(e service.CallEvent) {
	r.called[e.Attempt.TaskID] = e.Took
	r.actions = append(r.actions, e.Action())
}
func (r *recorder) Finished(e service.FinishEvent) { r.finished = append(r.finished, e) }
func (r *recorder) Completed(res service.Result)   { r.completed[res.TaskID] = res.Kind }
func (r *recorder) SetAside(res service.Result)    { r.setAside = append(r.setAside, res.TaskID) }

// claimedTasks sums the tasks of the claims that succeeded; failed counts those that did not.
func (r *recorder) claimedTasks() (tasks, failed int) {
	for _, c := range r.claimed {
		if c.Err != nil {
			failed++
			continue
		}
		tasks += c.Tasks
	}
	return tasks, failed
}

// The loop tells its Observer of every claim, each call with the duration it measured around the
// call, every finish, and each task's result: a set-aside task as SetAside, the rest as Completed.
func TestRunReportsToItsObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		m := newMem(3, func(a *service.Attempt) delivery.Observation {
			time.Sleep(time.Duration(a.TaskID) * 10 * time.Millisecond) // each task its own duration
			return delivery.Observation{Outcome: delivery.OutcomeAccepted}
		})
		m.settled = []service.Result{{Kind: service.ResultSetAside, TaskID: 7, Channel: "push"},
			{Kind: service.ResultSuppressed, TaskID: 8, Channel: "push"}}
		r := newRecorder()
		runUntil(t, m, Config{MaxInFlight: 8, Batch: 8, Logger: quiet, Poll: time.Millisecond, Observer: r},
			func() bool { return len(m.finishedIDs()) == 3 })
		is.Equal(r.called, map[int64]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond,
			3: 30 * time.Millisecond}) // each call, with the duration it took
		is.Equal(r.actions, []delivery.Action{delivery.ActionSend, delivery.ActionSend, delivery.ActionSend})
		is.Equal(r.completed, map[int64]service.ResultKind{1: service.ResultSent, 2: service.ResultSent,
			3: service.ResultSent, 8: service.ResultSuppressed}) // settled at claim, or by a finish
		is.Equal(r.setAside, []int64{7}) // and only as set aside
		tasks, failed := r.claimedTasks()
		is.Equal(tasks, 5) // three to call, two settled
		is.Equal(failed, 0)
		answers := 0
		for _, f := range r.finished {
			is.NoErr(f.Err)
			answers += f.Tasks
		}
		is.Equal(answers, 3)
	})
}

// Failed claims and finishes reach the Observer with their error; a failed finish reports no result.
func TestRunReportsFailuresToItsObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		refused := errors.New("finish refused")
		m := newMem(2, accepted)
		m.finishErr = refused
		r := newRecorder()
		runUntil(t, m, Config{MaxInFlight: 8, Batch: 8, Logger: quiet, Poll: time.Millisecond, Observer: r},
			func() bool { return len(m.finishedIDs()) == 2 })
		is.Equal(len(r.completed), 0) // nothing recorded, nothing completed
		answers := 0
		for _, f := range r.finished {
			is.True(errors.Is(f.Err, refused))
			answers += f.Tasks
		}
		is.Equal(answers, 2)

		down := errors.New("connection refused")
		m = newMem(0, accepted)
		m.claimErr = down
		r = newRecorder()
		runUntil(t, m, Config{Logger: quiet, Poll: time.Millisecond, Observer: r}, func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.claims) >= 2
		})
		_, failed := r.claimedTasks()
		is.True(failed >= 2)
		is.True(errors.Is(r.claimed[0].Err, down))
	})
}

// RunOnce reports its call, timed once, and its result, to the Observer it is given.
func TestRunOnceReportsToItsObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		d := &slowOnce{onceDispatcher{attempts: []*service.Attempt{{TaskID: 9, Channel: "push", No: 1,
			Action: delivery.ActionTopicResend}}}}
		r := newRecorder()
		res, err := RunOnce(context.Background(), d, quiet, r)
		is.NoErr(err)
		is.Equal(res.Kind, service.ResultSent)
		is.Equal(r.called, map[int64]time.Duration{9: 40 * time.Millisecond})
		is.Equal(r.actions, []delivery.Action{delivery.ActionTopicResend})
		is.Equal(r.completed, map[int64]service.ResultKind{9: service.ResultSent})

		set := &onceDispatcher{settled: []service.Result{{Kind: service.ResultSetAside, TaskID: 4, Err: errors.New("refused")}}}
		r = newRecorder()
		_, err = RunOnce(context.Background(), set, quiet, r)
		is.True(err != nil) // a set-aside task is the one-shot's error
		is.Equal(r.setAside, []int64{4})
		is.Equal(len(r.completed), 0)
	})
}

// slowOnce is a onceDispatcher whose call takes 40 ms.
type slowOnce struct{ onceDispatcher }

func (d *slowOnce) Call(ctx context.Context, a *service.Attempt) delivery.Observation {
	time.Sleep(40 * time.Millisecond)
	return d.onceDispatcher.Call(ctx, a)
}
