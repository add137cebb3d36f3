package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// The loop's decisions, as a table: the window's state in, what it does out. No goroutine, no clock.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testWindow(mut func(w *window)) *window {
	w := newWindow(Config{MaxInFlight: 64, Batch: 16, FinishBatch: 10, Finishers: 2, FinishDelay: 2 * time.Millisecond,
		Poll: 200 * time.Millisecond, MaxBackoff: 10 * time.Second, ReadOnlyGrace: time.Minute}.WithDefaults())
	w.jitter = func(d time.Duration) time.Duration { return d } // the spread has a test of its own
	if mut != nil {
		mut(w)
	}
	return w
}

func answers(n int) []answer { return make([]answer, n) }

func TestWindowClaimDue(t *testing.T) {
	for _, c := range []struct {
		name  string
		w     *window
		due   bool
		limit int
	}{
		{"idle: a full batch", testWindow(nil), true, 16},
		{"room worth a claim", testWindow(func(w *window) { w.calling = 56 }), true, 8},
		{"room not worth a claim yet", testWindow(func(w *window) { w.calling = 57 }), false, 0},
		{"full", testWindow(func(w *window) { w.calling = 64 }), false, 0},
		{"a claim runs", testWindow(func(w *window) { w.claiming = true }), false, 0},
		{"stopping", testWindow(func(w *window) { w.stopping = true }), false, 0},
		{"backing off", testWindow(func(w *window) { w.nextClaim = t0.Add(time.Millisecond) }), false, 0},
		{"pause over", testWindow(func(w *window) { w.nextClaim = t0 }), true, 16},
		{"the database is behind", testWindow(func(w *window) { w.waiting, w.recording = answers(40), 25 }), false, 0},
		{"the database keeps up", testWindow(func(w *window) { w.waiting, w.recording = answers(40), 24 }), true, 16},
		{"window of one, empty", newWindow(Config{MaxInFlight: 1}.WithDefaults()), true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			limit, due := c.w.claimDue(t0)
			is.Equal(due, c.due)
			is.Equal(limit, c.limit)
		})
	}
}

func TestWindowTakeGroups(t *testing.T) {
	for _, c := range []struct {
		name   string
		w      *window
		groups []int // sizes
	}{
		{"nothing waits", testWindow(func(w *window) { w.calling = 5 }), nil},
		{"one answer, others in flight, fresh", testWindow(func(w *window) { w.calling, w.waiting, w.oldest = 5, answers(1), t0 }), nil},
		{"one answer, waited FinishDelay", testWindow(func(w *window) { w.calling, w.waiting, w.oldest = 5, answers(1), t0.Add(-2*time.Millisecond) }), []int{1}},
		{"one answer, nothing in flight", testWindow(func(w *window) { w.waiting, w.oldest = answers(1), t0 }), []int{1}},
		{"a full group", testWindow(func(w *window) { w.calling, w.waiting, w.oldest = 5, answers(10), t0 }), []int{10}},
		{"more than a group: both finishers", testWindow(func(w *window) { w.calling, w.waiting, w.oldest = 5, answers(25), t0 }), []int{10, 10}},
		{"one finisher free", testWindow(func(w *window) { w.calling, w.waiting, w.oldest, w.finishing = 5, answers(25), t0, 1 }), []int{10}},
		{"no finisher free", testWindow(func(w *window) { w.waiting, w.finishing = answers(25), 2 }), nil},
		{"stopping: whatever waits", testWindow(func(w *window) { w.calling, w.waiting, w.oldest, w.stopping = 5, answers(3), t0, true }), []int{3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			before := len(c.w.waiting) + c.w.recording
			var sizes []int
			for _, g := range c.w.takeGroups(t0) {
				sizes = append(sizes, len(g))
			}
			is.Equal(sizes, c.groups)
			is.Equal(len(c.w.waiting)+c.w.recording, before) // answers move from waiting to recording, none lost
		})
	}
}

func TestWindowWake(t *testing.T) {
	for _, c := range []struct {
		name string
		w    *window
		want time.Time
	}{
		{"nothing to wait for", testWindow(nil), time.Time{}},
		{"the pause ends", testWindow(func(w *window) { w.nextClaim = t0.Add(time.Second) }), t0.Add(time.Second)},
		{"the pause ends, but a claim runs", testWindow(func(w *window) { w.nextClaim, w.claiming = t0.Add(time.Second), true }), time.Time{}},
		{"the pause ends, but the window is full", testWindow(func(w *window) { w.nextClaim, w.calling = t0.Add(time.Second), 64 }), time.Time{}},
		{"an answer will have waited", testWindow(func(w *window) { w.waiting, w.oldest = answers(1), t0 }), t0.Add(2 * time.Millisecond)},
		{"the earlier of both", testWindow(func(w *window) { w.nextClaim, w.waiting, w.oldest = t0.Add(time.Second), answers(1), t0 }), t0.Add(2 * time.Millisecond)},
		{"an answer waits for a finisher", testWindow(func(w *window) { w.waiting, w.oldest, w.finishing = answers(1), t0, 2 }), time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			is.New(t).Equal(c.w.wake(t0), c.want)
		})
	}
}

func TestWindowBackoff(t *testing.T) {
	is := is.New(t)
	w := testWindow(nil)
	refused := errors.New("connection refused")
	var waits []time.Duration
	for range 9 {
		w.claimStarted()
		is.Equal(w.claimed(0, 0, refused, false, false, t0), claimFailed)
		waits = append(waits, w.nextClaim.Sub(t0))
	}
	is.Equal(waits, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond,
		3200 * time.Millisecond, 6400 * time.Millisecond, 10 * time.Second, 10 * time.Second, 10 * time.Second}) // doubling, capped
	w.claimStarted()
	is.Equal(w.claimed(3, 0, nil, false, false, t0), claimOK)
	is.Equal(w.backoff, time.Duration(0)) // recovered
	is.Equal(w.calling, 3)                // its calls are in flight
	w.finished(0, true, t0)               // a finish fails
	is.Equal(w.backoff, 200*time.Millisecond)
	w.claimStarted()
	is.Equal(w.claimed(1, 0, nil, true, false, t0), claimOK) // a claim behind that finish succeeds
	is.Equal(w.backoff, 200*time.Millisecond)                // but the finish's trouble keeps the backoff
	w.claimStarted()
	is.Equal(w.claimed(0, 0, nil, false, false, t0), claimOK) // nothing due
	is.Equal(w.nextClaim, t0.Add(200*time.Millisecond))       // poll
	w.claimStarted()
	is.Equal(w.claimed(0, 0, refused, false, true, t0), claimStopping) // failed because the loop stops
	is.True(!w.claiming)
}

func TestWindowReadOnlyGrace(t *testing.T) {
	is := is.New(t)
	w := testWindow(nil)
	standby := &service.ReadOnlyError{Op: "claim", Reason: "SQLSTATE 25006"}
	w.claimStarted()
	is.Equal(w.claimed(0, 0, standby, false, false, t0), claimReadOnly) // said once when it begins
	w.claimStarted()
	is.Equal(w.claimed(0, 0, standby, false, false, t0.Add(59*time.Second)), claimFailed)
	is.True(!w.stopping) // within the grace
	w.claimStarted()
	is.Equal(w.claimed(0, 0, nil, false, false, t0.Add(59*time.Second)), claimOK) // a primary again
	w.claimStarted()
	is.Equal(w.claimed(0, 0, standby, false, false, t0.Add(2*time.Minute)), claimReadOnly) // the grace starts over
	w.claimStarted()
	w.claimed(0, 0, standby, false, false, t0.Add(3*time.Minute))
	is.True(w.stopping)                              // past it: stop
	is.True(errors.Is(w.fatal, service.ErrReadOnly)) // and say why
}

func TestWindowStopsForPooler(t *testing.T) {
	is := is.New(t)
	pooler := &service.PoolerError{Fix: "add default_query_exec_mode=exec", Err: errors.New("SQLSTATE 26000")}
	w := testWindow(nil)
	w.finished(0, true, t0)
	is.True(!w.stopFor(errors.New("connection refused"))) // a failing database is retried
	is.True(!w.stopping)
	is.True(w.stopFor(pooler)) // a pooler's configuration is not
	is.True(w.stopping)
	is.Equal(w.fatal, error(pooler)) // and says why
	w = testWindow(nil)
	w.claimStarted()
	is.Equal(w.claimed(0, 0, pooler, false, false, t0), claimPooler) // a claim that meets it stops the loop
	is.True(w.stopping && errors.Is(w.fatal, service.ErrPooler))
	w.claimStarted()
	is.Equal(w.claimed(0, 0, pooler, false, false, t0), claimStopping) // said once
}

func TestWindowDone(t *testing.T) {
	is := is.New(t)
	is.True(!testWindow(nil).done())                                                 // not stopping
	is.True(testWindow(func(w *window) { w.stopping = true }).done())                // stopping, nothing held
	is.True(!testWindow(func(w *window) { w.stopping, w.calling = true, 1 }).done()) // a call in flight
	is.True(!testWindow(func(w *window) { w.stopping, w.waiting = true, answers(1) }).done())
	is.True(!testWindow(func(w *window) { w.stopping, w.claiming = true, true }).done())
	is.True(!testWindow(func(w *window) { w.stopping, w.finishing = true, 1 }).done())
}

// The first answer to wait starts the FinishDelay; later ones join it without moving it on.
func TestWindowAnsweredStartsTheWaitOnce(t *testing.T) {
	is := is.New(t)
	w := testWindow(func(w *window) { w.calling = 3 })
	w.answered(answer{}, t0)
	w.answered(answer{}, t0.Add(time.Millisecond))
	is.Equal(w.calling, 1)
	is.Equal(len(w.waiting), 2)
	is.Equal(w.oldest, t0) // the first answer's wait, not the last one's
	w.takeGroups(t0.Add(2 * time.Millisecond))
	w.answered(answer{}, t0.Add(5*time.Millisecond))
	is.Equal(w.oldest, t0.Add(5*time.Millisecond)) // a new wait once the others went
}

// A claim that found work claims again at once; only one that found nothing polls. Tasks settled
// without a call count as work found: more may be due behind them.
func TestWindowClaimedPollsOnlyWhenNothingWasDue(t *testing.T) {
	for _, c := range []struct {
		name           string
		calls, settled int
		next           time.Time
	}{
		{"nothing due: poll", 0, 0, t0.Add(200 * time.Millisecond)},
		{"calls", 2, 0, time.Time{}},
		{"settled only", 0, 2, time.Time{}},
		{"as many settled as called", 1, 1, time.Time{}},
		{"more settled than called", 1, 3, time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			w := testWindow(nil)
			w.claimStarted()
			is.Equal(w.claimed(c.calls, c.settled, nil, false, false, t0), claimOK)
			is.Equal(w.nextClaim, c.next)
			is.Equal(w.calling, c.calls)
		})
	}
}

// WithDefaults fills each zero or negative field and keeps each set one.
func TestConfigWithDefaults(t *testing.T) {
	is := is.New(t)
	d := Config{}.WithDefaults()
	is.Equal(d.MaxInFlight, DefaultMaxInFlight)
	is.Equal(d.Batch, DefaultBatch)
	is.Equal(d.FinishBatch, DefaultFinishBatch)
	is.Equal(d.Finishers, DefaultFinishers)
	is.Equal(d.Poll, DefaultPoll)
	is.Equal(d.FinishDelay, DefaultFinishDelay)
	is.Equal(d.MaxBackoff, DefaultMaxBackoff)
	is.Equal(d.ReadOnlyGrace, DefaultReadOnlyGrace)
	is.True(d.Logger != nil)
	is.Equal(d.Observer, service.Observer(service.NopObserver{})) // reports to no one

	n := Config{MaxInFlight: -1, Batch: -1, FinishBatch: -1, Finishers: -1, Poll: -1, FinishDelay: -1, MaxBackoff: -1, ReadOnlyGrace: -1}.WithDefaults()
	is.Equal(n, Config{MaxInFlight: DefaultMaxInFlight, Batch: DefaultBatch, FinishBatch: DefaultFinishBatch, Finishers: DefaultFinishers,
		Poll: DefaultPoll, FinishDelay: DefaultFinishDelay, MaxBackoff: DefaultMaxBackoff, ReadOnlyGrace: DefaultReadOnlyGrace, Logger: n.Logger,
		Observer: service.NopObserver{}})

	set := Config{MaxInFlight: 10, Batch: 4, FinishBatch: 3, Finishers: 2, Poll: time.Nanosecond, FinishDelay: time.Nanosecond,
		MaxBackoff: time.Nanosecond, ReadOnlyGrace: time.Nanosecond, Logger: quiet, Observer: newRecorder()}
	is.Equal(set.WithDefaults(), set) // the smallest settings are kept, not taken for unset

	is.Equal(Config{MaxInFlight: 3, Batch: 64}.WithDefaults().Batch, 3)                           // a claim never exceeds the window
	is.Equal(Config{MaxInFlight: 1 << 20, Batch: 1 << 20}.WithDefaults().Batch, service.MaxBatch) // nor the service's batch
}
