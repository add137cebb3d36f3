package cli

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/seedcase"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// oneTask creates a preference and a notification with one task on channel; it returns the task id.
func oneTask(t *testing.T, pool *pgxpool.Pool, channel string) int64 {
	t.Helper()
	is := is.New(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	_, err := n.SetPreference(ctx, "u1", channel, "device-1", true)
	is.NoErr(err) // preference
	_, _, tasks, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1", Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // notification
	is.Equal(len(tasks), 1) // one task
	return tasks[0].TaskID
}

// waitLeaseExpired waits, on the database clock, until the task's lease has run out.
func waitLeaseExpired(t *testing.T, pool *pgxpool.Pool, taskID int64) {
	t.Helper()
	testworld.Eventually(t, 30*time.Second, "the lease to expire", func() bool {
		var expired bool
		err := pool.QueryRow(context.Background(),
			`SELECT lease_until < now() FROM delivery_task WHERE id = $1`, taskID).Scan(&expired)
		if err != nil {
			t.Fatalf("read lease: %v", err)
		}
		return expired
	})
}

// TestP1KilledWorkerLeaseExpires (P1, docs/testing.md#seed-cases): a worker process is SIGKILLed while its call hangs after
// the channel accepted. The task stays SENDING; a probe during the lease claims nothing; after the
// lease a second process takes over, and counts the lost call as uncertain: on push (idempotent) it
// resends with the same key (ACCEPTED_REPLAY), on sms (queryable) it asks first (QUERY_FOUND) and sends
// nothing. Either way the task is SENT with one outbound message and attempt 1 reads LEASE_EXPIRED. The
// sms variant fails if a takeover stopped counting as uncertain (it would resend: 2 messages).
func TestP1KilledWorkerLeaseExpires(t *testing.T) {
	for _, tc := range []struct {
		kind     fakes.Kind
		mode     string
		action   delivery.Action
		outcome  delivery.Outcome
		seedCase string // testdata/seed/traces.json
	}{
		{fakes.Push, "idempotent", delivery.ActionSend, delivery.OutcomeAcceptedReplay, "P1"},
		{fakes.SMS, "queryable", delivery.ActionQuery, delivery.OutcomeQueryFound, "P1-sms"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			c, pool := newCLI(t)
			n := service.NewNotifier(pool)
			ctx := context.Background()
			fake := startFake(t, tc.kind)
			taskID := oneTask(t, pool, string(tc.kind))
			ref := refOf(t, pool, taskID)
			fake.ScriptSend(ref, fakes.Step{Hang: true})
			channel := string(tc.kind) + "=" + tc.mode + "," + fake.URL()

			a := c.in(t).start("work", "--once", "--worker-id", "A", "--channel", channel,
				"--lease", "3s", "--timeout", "60s", "--allow-lease-overlap")
			waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			is.NoErr(fake.WaitOutbound(waitCtx, ref, 1)) // A's send was accepted; the answer hangs
			is.Equal(a.stop(syscall.SIGKILL), -1)        // A is killed, no chance to record anything

			task, err := n.Task(ctx, taskID)
			is.NoErr(err)                               // the task reads back
			is.Equal(task.State, delivery.StateSending) // still held by the dead worker
			is.Equal(task.LeaseOwner, "A")              // by A

			r := c.in(t).ok("work", "--once", "--worker-id", "probe", "--channel", channel)
			is.Equal(r.stdout, "{\"result\":\"NOTHING\"}\n") // during the lease nobody else may claim it

			waitLeaseExpired(t, pool, taskID)
			r = c.in(t).ok("work", "--once", "--worker-id", "B", "--channel", channel)
			var res service.Result
			decode(t, r.stdout, &res)
			is.Equal(res.Kind, service.ResultSent)                                                   // B completes
			is.Equal(res.Attempt, 2)                                                                 // as attempt 2
			is.Equal(res.Action, tc.action)                                                          // resending with the key, or asking first: the lost call counts as uncertain
			is.Equal(res.Outcome, tc.outcome)                                                        // and the channel knows the original
			logged(t, r.stderr, "msg=CLAIMED", "worker=B", "attempt=2", "action="+string(tc.action)) // B's log: the claim
			logged(t, r.stderr, "msg=CALLED", "attempt=2", "outcome="+string(tc.outcome))            // the call
			logged(t, r.stderr, "msg=RESULT", "result=SENT", "attempt=2")                            // the result

			// A's attempt closed as LEASE_EXPIRED by B's claim, then B's; the user got one message.
			checkSeed(t, pool, tc.seedCase, taskID, fake)
		})
	}
}

// TestP2StoppedWorkerIsStale (P2, docs/testing.md#seed-cases): lease 1 s, client timeout 1.5 s, so holders can overlap on
// purpose. Worker A is SIGSTOPped after the channel accepted; after the lease worker B takes over and
// completes (ACCEPTED_REPLAY, SENT); A resumes, times out and finishes with its old token: 0 rows,
// STALE, the observation kept as attempt 1's late_outcome; the task stays SENT.
func TestP2StoppedWorkerIsStale(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	taskID := oneTask(t, pool, "push")
	ref := refOf(t, pool, taskID)
	push.ScriptSend(ref, fakes.Step{Delay: 10 * time.Second}) // accepted, answered far too late
	channel := "push=idempotent," + push.URL()

	a := stoppedHolder(t, c, pool, push, channel, taskID)
	r := c.ok("work", "--once", "--worker-id", "B", "--channel", channel, "--timeout", "5s")
	var b service.Result
	decode(t, r.stdout, &b)
	is.Equal(b.Kind, service.ResultSent)                // B completes
	is.Equal(b.Attempt, 2)                              // as attempt 2
	is.Equal(b.Outcome, delivery.OutcomeAcceptedReplay) // replayed by the channel

	is.NoErr(a.cmd.Process.Signal(syscall.SIGCONT)) // A resumes, past its client timeout
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker A did not finish; stderr:\n%s", a.stderr)
	}
	is.Equal(a.cmd.ProcessState.ExitCode(), 0) // A ends normally
	var stale service.Result
	decode(t, a.stdout.String(), &stale)
	is.Equal(stale.Kind, service.ResultStale)                                 // its finish changed nothing
	is.Equal(stale.Attempt, 1)                                                // for attempt 1
	is.Equal(stale.Outcome, delivery.OutcomeTimeout)                          // which timed out
	logged(t, a.stderr.String(), "msg=CALLED", "worker=A", "outcome=TIMEOUT") // A's log: the late call
	logged(t, a.stderr.String(), "msg=RESULT", "result=STALE", "attempt=1")   // and its refused finish

	// Still SENT: the late observation did not overwrite it, but is kept on A's attempt, which B's claim
	// closed as LEASE_EXPIRED; B's replay; one message for the user.
	checkSeed(t, pool, "P2", taskID, push)
}

// TestP2StaleFinishWhileNewHolderCalls is P2 with the late finish landing while worker B is still
// calling: the task is SENDING again, so only the attempt token (not the state) tells A's finish from
// B's. A's finish is STALE and leaves B's holding alone; B's finish then records SENT.
func TestP2StaleFinishWhileNewHolderCalls(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	taskID := oneTask(t, pool, "push")
	ref := refOf(t, pool, taskID)
	push.ScriptSend(ref,
		fakes.Step{Delay: 10 * time.Second}, // A: accepted, answered far too late
		fakes.Step{Delay: 8 * time.Second})  // B: replayed, answered after A's finish has landed
	channel := "push=idempotent," + push.URL()

	a := stoppedHolder(t, c, pool, push, channel, taskID)
	b := c.start("work", "--once", "--worker-id", "B", "--channel", channel, "--timeout", "20s", "--lease", "60s")
	testworld.Eventually(t, 20*time.Second, "B's resend to reach the channel", func() bool { return push.Sends(ref) == 2 })
	task, err := n.Task(ctx, taskID)
	is.NoErr(err)
	is.Equal(task.LeaseOwner, "B") // B holds the task and is calling

	is.NoErr(a.cmd.Process.Signal(syscall.SIGCONT)) // A resumes, past its client timeout
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker A did not finish; stderr:\n%s", a.stderr)
	}
	var stale service.Result
	decode(t, a.stdout.String(), &stale)
	is.Equal(stale.Kind, service.ResultStale) // A's finish changed nothing
	task, err = n.Task(ctx, taskID)
	is.NoErr(err)
	is.Equal(task.State, delivery.StateSending) // B's holding is intact
	is.Equal(task.LeaseOwner, "B")              // with B's lease

	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker B did not finish; stderr:\n%s", b.stderr)
	}
	var res service.Result
	decode(t, b.stdout.String(), &res)
	is.Equal(res.Kind, service.ResultSent) // B's finish counts
	attempts, err := n.Attempts(ctx, taskID)
	is.NoErr(err)
	is.Equal(attempts[0].Outcome, delivery.OutcomeLeaseExpired)   // A's, closed by B's claim
	is.Equal(attempts[0].LateOutcome, delivery.OutcomeTimeout)    // with A's late observation kept
	is.Equal(attempts[1].Outcome, delivery.OutcomeAcceptedReplay) // B's
	is.Equal(push.Outbound(ref), 1)                               // one message for the user
}

// stoppedHolder starts worker A (`work --once`, lease 1 s, client timeout 1.5 s: holders may overlap on
// purpose), waits until the channel accepted its send, SIGSTOPs it mid-call and waits, on the database
// clock, until its lease has expired. A is continued when the test ends, whatever happens.
func stoppedHolder(t *testing.T, c notifierCLI, pool *pgxpool.Pool, push *fakes.Channel, channel string, taskID int64) *process {
	t.Helper()
	is := is.New(t)
	a := c.start("work", "--once", "--worker-id", "A", "--channel", channel,
		"--lease", "1s", "--timeout", "1500ms", "--allow-lease-overlap")
	waitCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	is.NoErr(push.WaitOutbound(waitCtx, refOf(t, pool, taskID), 1)) // A's send was accepted
	is.NoErr(a.cmd.Process.Signal(syscall.SIGSTOP))                 // A freezes mid-call
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) }) // never leave it stopped
	waitLeaseExpired(t, pool, taskID)
	return a
}

// logged fails unless one line of a worker's text log has every one of fields.
func logged(t *testing.T, log string, fields ...string) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, f := range fields {
			all = all && strings.Contains(line, f)
		}
		if all {
			return
		}
	}
	t.Fatalf("no log line with %v in:\n%s", fields, log)
}

// checkSeed holds a seed case's task to the case's expected end (testdata/seed/traces.json), with what
// fake counted under its reference.
func checkSeed(t *testing.T, pool *pgxpool.Pool, name string, taskID int64, fake *fakes.Channel) {
	t.Helper()
	n := service.NewNotifier(pool)
	task, err := n.Task(context.Background(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	attempts, err := n.Attempts(context.Background(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	got := seedcase.Got{State: string(task.State), Parked: task.NeedsReview,
		Sends: fake.Sends(task.Ref), Queries: fake.Queries(task.Ref), Outbound: fake.Outbound(task.Ref)}
	for _, a := range attempts {
		got.Outcomes = append(got.Outcomes, string(a.Outcome))
		got.LateOutcomes = append(got.LateOutcomes, string(a.LateOutcome))
	}
	seedcase.Check(t, name, got)
}
