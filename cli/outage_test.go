package cli

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestDatabaseOutage: the database disappears under a running worker, in the middle of a call. The
// worker keeps running and says so once (not once per retry); the finish that fails is sent again, and
// once the database is back it lands: the answer is recorded, the task SENT on its first attempt, with
// no lease expiry and no resend. Not parallel: it stops the cluster the package's tests share.
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
		"--timeout", "5s", "--lease", "30s", "--poll", "50ms")
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	is.NoErr(push.WaitOutbound(waitCtx, ref, 1)) // the call is in flight
	is.NoErr(pgtest.Cluster().Stop())            // the database goes away
	testworld.Eventually(t, 20*time.Second, "the finish to fail while the database is down", func() bool {
		return strings.Contains(w.stderr.String(), "finish failed; sending it again")
	})
	select {
	case <-w.done:
		t.Fatalf("the worker exited while the database was down:\n%s", w.stderr)
	default:
	}
	is.NoErr(pgtest.Cluster().Start(ctx)) // the database comes back

	testworld.Eventually(t, 60*time.Second, "the task to be delivered after the outage", func() bool {
		task, err := n.Task(ctx, taskID)
		return err == nil && task.State == delivery.StateSent
	})
	testworld.Eventually(t, 30*time.Second, "the claims to recover", func() bool {
		return strings.Contains(w.stderr.String(), "cycles recovered")
	})
	is.Equal(w.stop(syscall.SIGTERM), 0) // still a healthy worker

	log := w.stderr.String()
	is.Equal(strings.Count(log, "finish failed; sending it again"), 1) // the lost finish is said once, not per retry
	is.Equal(strings.Count(log, "cycles failing"), 1)                  // one line for the outage...
	is.Equal(strings.Count(log, "cycles recovered"), 1)                // ...and one for the recovery, not one per retry
	attempts, err := n.Attempts(ctx, taskID)
	is.NoErr(err)
	is.Equal(len(attempts), 1)                              // no lease expiry, no second attempt
	is.Equal(attempts[0].Outcome, delivery.OutcomeAccepted) // the answer that came back during the outage
	is.Equal(push.Sends(ref), 1)                            // one request
}
