package worker_test

// The seed's cases (docs/testing.md#seed-cases) through the streaming loop, as `notifier work` runs
// them: one worker.Run with a window of calls, claims and finishes grouped, against the fakes and a real
// database. service/seed_test.go proves each case cycle by cycle; here the same expectations hold when
// claims, calls and finishes overlap.

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/seedcase"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/worker"
)

// streamWorld is the test world (a database and the three fakes) with streaming workers serving it.
type streamWorld struct {
	*testworld.World
}

// newStreamWorld starts the fakes; run starts the loop (after the test has scripted them).
func newStreamWorld(t *testing.T) *streamWorld {
	t.Helper()
	return &streamWorld{testworld.New(t)}
}

// run starts workers streaming loops (each its own dispatcher) with a client timeout of 400 ms, the
// seed's, and a first retry after 50 ms, until the test ends.
func (w *streamWorld) run(t *testing.T, workers int, modes map[string]delivery.Mode) {
	t.Helper()
	w.runWith(t, workers, modes, 50*time.Millisecond)
}

func (w *streamWorld) runWith(t *testing.T, workers int, modes map[string]delivery.Mode, backoff time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range workers {
		d := w.Dispatcher(service.DispatcherConfig{
			Worker: "w-stream-" + string(rune('a'+i)), Routes: w.Routes(modes, nil, nil), CallTimeout: 400 * time.Millisecond,
			Backoff: delivery.Backoff{Base: backoff},
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker.Run(ctx, d, worker.Config{MaxInFlight: 16, Batch: 8, Poll: 20 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func (w *streamWorld) create(t *testing.T, user, event string, ttl time.Duration, maxAttempts int) []service.TaskRef {
	t.Helper()
	_, _, tasks, err := w.Notifier.Create(context.Background(), service.CreateRequest{UserID: user, EventKey: event, Body: "order shipped", TTL: ttl, MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

// checkSeed holds a seed case's task, settled, to the case's expected end (testdata/seed/traces.json),
// with what fake counted under its reference.
func (w *streamWorld) checkSeed(t *testing.T, name string, taskID int64, fake *fakes.Channel) taskState {
	t.Helper()
	s := settle(t, w.Pool, taskID)
	ref := refOf(t, w.Pool, taskID)
	seedcase.Check(t, name, seedcase.Got{Outcomes: outcomesOf(s), State: s.State, Parked: s.Parked,
		Sends: fake.Sends(ref), Queries: fake.Queries(ref), Outbound: fake.Outbound(ref)})
	return s
}

func outcomesOf(s taskState) []string {
	var out []string
	for _, a := range s.Attempts {
		out = append(out, a.Outcome)
	}
	return out
}

// T1, T2 (timeouts), N2 (normal delivery), F1 (refused before acceptance), NC2 (the negative control:
// a channel that cannot dedupe treated as if it could) on one streaming worker at once.
func TestSeedCasesStreaming(t *testing.T) {
	w := newStreamWorld(t)
	w.User("u1", "push", "sms")
	w.User("u2", "push")
	w.User("u3", "sms")
	w.User("u4", "none")
	t1t2 := w.create(t, "u1", "t1-t2", time.Hour, 3) // push then sms (ordered by channel)
	n2 := w.create(t, "u2", "n2", time.Hour, 3)[0].TaskID
	f1Retry := w.create(t, "u3", "f1-503", time.Hour, 3)[0].TaskID
	f1Reject := w.create(t, "u2", "f1-400", time.Hour, 3)[0].TaskID
	nc2 := w.create(t, "u4", "nc2", time.Hour, 3)[0].TaskID
	push, sms := t1t2[0].TaskID, t1t2[1].TaskID
	w.Push.ScriptSend(refOf(t, w.Pool, push), fakes.Step{Delay: 1200 * time.Millisecond})
	w.SMS.ScriptSend(refOf(t, w.Pool, sms), fakes.Step{Delay: 1200 * time.Millisecond})
	w.SMS.ScriptSend(refOf(t, w.Pool, f1Retry), fakes.Step{Status: 503})
	w.Push.ScriptSend(refOf(t, w.Pool, f1Reject), fakes.Step{Status: 400})
	w.None.ScriptSend(refOf(t, w.Pool, nc2), fakes.Step{Delay: 1200 * time.Millisecond})
	w.run(t, 1, map[string]delivery.Mode{"none": delivery.ModeIdempotent}) // NC2: blind resends on none

	w.checkSeed(t, "T1", push, w.Push)
	w.checkSeed(t, "T2", sms, w.SMS)
	w.checkSeed(t, "N2-push", n2, w.Push)
	w.checkSeed(t, "F1-503", f1Retry, w.SMS) // refused before acceptance, retried
	w.checkSeed(t, "F1-400", f1Reject, w.Push)
	w.checkSeed(t, "NC2", nc2, w.None) // one logical notification, SENT; damage: the user got it twice
}

// T3, B1 and B3: where the stream must park, suppress or fail, never write off what went out.
func TestSeedCasesStreamingParkAndWriteOff(t *testing.T) {
	is := is.New(t)
	w := newStreamWorld(t)
	w.User("u1", "sms")
	w.User("u2", "push")
	w.User("u3", "push")
	t3 := w.create(t, "u1", "t3", time.Hour, 3)[0].TaskID
	b3 := w.create(t, "u3", "b3", time.Hour, 2)[0].TaskID
	suppressed := w.create(t, "u2", "b1-pref", time.Hour, 3)[0].TaskID
	_, err := w.Notifier.SetPreference(context.Background(), "u2", "push", "u2@push", false) // disabled before the claim
	is.NoErr(err)
	w.SMS.ScriptSend(refOf(t, w.Pool, t3), fakes.Step{Delay: 1200 * time.Millisecond})
	w.SMS.ScriptQuery(refOf(t, w.Pool, t3), fakes.Step{Status: 503}, fakes.Step{Status: 503})
	w.Push.ScriptSend(refOf(t, w.Pool, b3), fakes.Step{Delay: 1200 * time.Millisecond}, fakes.Step{Status: 503})
	w.run(t, 1, nil)

	w.checkSeed(t, "T3", t3, w.SMS)
	w.checkSeed(t, "B3", b3, w.Push) // not FAILED: the first may have gone out
	w.checkSeed(t, "B1-pref", suppressed, w.Push)
}

// C1 through the stream: four workers with windows drain 40 tasks: every task called once, one message
// each, one attempt each.
func TestSeedC1Streaming(t *testing.T) {
	is := is.New(t)
	w := newStreamWorld(t)
	w.User("u1", "push")
	var ids []int64
	for i := range 40 {
		ids = append(ids, w.create(t, "u1", "c1-"+string(rune('a'+i%26))+string(rune('a'+i/26)), time.Hour, 3)[0].TaskID)
	}
	w.run(t, 4, nil)
	for _, id := range ids {
		got := settle(t, w.Pool, id)
		is.Equal(outcomesOf(got), []string{"ACCEPTED"}) // one attempt each
	}
	is.Equal(w.Push.TotalSends(), 40)    // 40 requests
	is.Equal(w.Push.TotalOutbound(), 40) // 40 messages
}

// B2 through the stream: sms, TTL 2 s, the first call accepted then timed out, the retry 2.5 s later:
// the notification has expired by then, and the task is parked, not FAILED (the first call went out).
func TestSeedB2Streaming(t *testing.T) {
	w := newStreamWorld(t)
	w.User("u1", "sms")
	b2 := w.create(t, "u1", "b2", 2*time.Second, 3)[0].TaskID
	w.SMS.ScriptSend(refOf(t, w.Pool, b2), fakes.Step{Delay: 1200 * time.Millisecond})
	w.runWith(t, 1, nil, 2500*time.Millisecond)
	w.checkSeed(t, "B2", b2, w.SMS) // not FAILED; no query after the expiry; the one that went out
}
