package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
)

// TestDatabaseOutage: the database disappears under a running worker, in the middle of a call. The
// worker keeps running and says so once (not once per retry); the finish that failed leaves the task
// SENDING; once the database is back, lease expiry recovers the task as uncertain and it is delivered
// once. Not parallel: it stops the cluster the package's tests share.
func TestDatabaseOutage(t *testing.T) {
	if pgtest.Cluster() == nil {
		t.Skip("needs the harness's own cluster (TEST_DATABASE_URL points elsewhere)")
	}
	is := is.New(t)
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	taskID := oneTask(t, pool, "push")
	ref := refOf(t, pool, taskID)
	push.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second}) // accepted; the answer comes while the database is down

	w := c.start("work", "--worker-id", "W", "--channel", "push=idempotent,"+push.URL(),
		"--timeout", "5s", "--lease", "8s", "--poll", "50ms")
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	is.NoErr(push.WaitOutbound(waitCtx, ref, 1)) // the call is in flight
	is.NoErr(pgtest.Cluster().Stop())            // the database goes away
	time.Sleep(4 * time.Second)                  // the call ends, its finish fails; the worker keeps polling a dead database
	select {
	case <-w.done:
		t.Fatalf("the worker exited while the database was down:\n%s", w.stderr)
	default:
	}
	is.NoErr(pgtest.Cluster().Start(ctx)) // the database comes back

	waitFor(t, 60*time.Second, "the task to be delivered after the outage", func() bool {
		task, err := n.Task(ctx, taskID)
		return err == nil && task.State == service.StateSent
	})
	is.Equal(w.stop(syscall.SIGTERM), 0) // still a healthy worker

	log := w.stderr.String()
	is.True(strings.Contains(log, "finish failed; the tasks will be recovered after their lease")) // the lost finish is said
	is.Equal(strings.Count(log, "cycles failing"), 1)                                              // one line for the outage...
	is.Equal(strings.Count(log, "cycles recovered"), 1)                                            // ...and one for the recovery, not one per retry
	attempts, err := n.Attempts(ctx, taskID)
	is.NoErr(err)
	is.Equal(len(attempts), 2)                                   // the lost attempt and its recovery
	is.Equal(attempts[0].Outcome, service.OutcomeLeaseExpired)   // the finish never landed: recovered as uncertain
	is.Equal(attempts[1].Outcome, service.OutcomeAcceptedReplay) // resent with the same key
	is.Equal(push.Outbound(ref), 1)                              // one message for the user
}
