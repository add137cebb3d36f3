package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestScript drives the binary the way a shell script would: preferences, create (twice), one
// delivery, status, review, a parked task, and its manual resolution.
func TestScript(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	push := startFake(t, fakes.Push)
	none := startFake(t, fakes.None)

	r := c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	var pref service.Preference
	decode(t, r.stdout, &pref)
	is.Equal(pref.UserID, "u1")        // the preference is printed
	is.Equal(pref.Channel, "push")     // for its channel
	is.Equal(pref.Address, "device-1") // with its address
	is.True(pref.Enabled)              // enabled by default

	r = c.ok("create", "--user", "u1", "--event-key", "order-1", "--body", "shipped")
	var first createOutput
	decode(t, r.stdout, &first)
	is.True(first.Created)                   // the first submission creates
	is.Equal(len(first.Tasks), 1)            // one task per enabled preference
	is.Equal(first.Tasks[0].Channel, "push") // on push

	r = c.ok("create", "--user", "u1", "--event-key", "order-1", "--body", "another body")
	var again createOutput
	decode(t, r.stdout, &again)
	is.True(!again.Created)                              // a repeat does not create
	is.Equal(again.NotificationID, first.NotificationID) // it gets the same notification
	is.Equal(again.Tasks, first.Tasks)                   // and the same tasks

	taskID := first.Tasks[0].TaskID
	r = c.ok("work", "--once", "--worker-id", "w1", "--channel", "push=IDEMPOTENT,"+push.URL())
	var sent service.Result
	decode(t, r.stdout, &sent)
	is.Equal(sent.Kind, service.ResultSent)            // delivered
	is.Equal(sent.TaskID, taskID)                      // the task just created
	is.Equal(sent.Channel, "push")                     // on push
	is.Equal(sent.Attempt, 1)                          // first attempt
	is.Equal(sent.Action, delivery.ActionSend)         // a send
	is.Equal(sent.Outcome, delivery.OutcomeAccepted)   // accepted
	is.Equal(push.Outbound(refOf(t, pool, taskID)), 1) // one message went out
	for _, event := range []string{"CLAIMED", "CALLED", "RESULT"} {
		is.True(strings.Contains(r.stderr, event)) // the cycle's events are logged on stderr
	}

	r = c.ok("work", "--once", "--channel", "push=idempotent,"+push.URL())
	is.Equal(strings.TrimSpace(r.stdout), `{"result":"NOTHING"}`) // nothing left to do

	r = c.ok("status", "--json")
	var st service.Status
	decode(t, r.stdout, &st)
	is.Equal(st.Parked, int64(0))                                                                     // nothing parked
	is.Equal(st.Counts, []service.StateCount{{Channel: "push", State: delivery.StateSent, Tasks: 1}}) // one SENT push task

	r = c.ok("status")
	is.True(strings.Contains(r.stdout, "CHANNEL")) // a table header for people
	is.True(strings.Contains(r.stdout, "SENT"))    // and the row

	r = c.ok("review")
	is.Equal(r.stdout, "") // no parked task: no output

	// A channel without idempotency or query, whose answer comes after the client timeout: parked.
	c.ok("pref", "set", "--user", "u2", "--channel", "none", "--address", "+100")
	r = c.run("parcel arrives today", "create", "--user", "u2", "--event-key", "order-2", "--body", "-")
	is.Equal(r.code, 0) // body from stdin
	var second createOutput
	decode(t, r.stdout, &second)
	is.Equal(len(second.Tasks), 1) // one task on the none channel
	parkedID := second.Tasks[0].TaskID
	none.ScriptSend(refOf(t, pool, parkedID), fakes.Step{Delay: 1200 * time.Millisecond})
	r = c.ok("work", "--once", "--channel", "none=none,"+none.URL(), "--timeout", "400ms")
	var parked service.Result
	decode(t, r.stdout, &parked)
	is.Equal(parked.Kind, service.ResultParked)       // parked for a human
	is.Equal(parked.Outcome, delivery.OutcomeTimeout) // after a timeout

	r = c.ok("review")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	is.Equal(len(lines), 1) // one JSON line per parked task
	var p service.ReviewTask
	decode(t, lines[0], &p)
	is.Equal(p.ID, parkedID)                                 // the parked task
	is.Equal(p.Review, service.ReviewParked)                 // shown because it is parked
	is.Equal(p.UserID, "u2")                                 // with its user
	is.Equal(p.EventKey, "order-2")                          // and event
	is.Equal(len(p.Attempts), 1)                             // and its history
	is.Equal(p.Attempts[0].Outcome, delivery.OutcomeTimeout) // verbatim

	id := strconv.FormatInt(parkedID, 10)
	r = c.ok("resolve", "--task", id, "--state", "sent", "--note", "the provider confirmed delivery")
	var resolved resolveOutput
	decode(t, r.stdout, &resolved)
	is.Equal(resolved, resolveOutput{TaskID: parkedID, State: delivery.StateSent, Changed: true}) // changed
	task, err := n.Task(context.Background(), parkedID)
	is.NoErr(err)                            // the task reads back
	is.Equal(task.State, delivery.StateSent) // SENT
	attempts, err := n.Attempts(context.Background(), parkedID)
	is.NoErr(err)                                                               // its attempts read back
	is.Equal(attempts[len(attempts)-1].Worker, "tester")                        // the operator defaults to $USER
	is.Equal(attempts[len(attempts)-1].Note, "the provider confirmed delivery") // with the note

	r = c.run("", "resolve", "--task", id, "--state", "FAILED", "--note", "again")
	is.Equal(r.code, 3)                                     // the second resolve changes nothing
	oneErrorLine(t, r)                                      // and says so on one line
	is.True(strings.Contains(r.stderr, "already resolved")) // which case it is
	is.Equal(r.stdout, "")                                  // no JSON for a non-change

	r = c.run("", "resolve", "--task", strconv.FormatInt(taskID, 10), "--state", "FAILED", "--note", "x")
	is.Equal(r.code, 3)                                            // a task that was never parked
	is.True(strings.Contains(r.stderr, "not parked (state SENT)")) // is named as such

	r = c.run("", "resolve", "--task", "999999", "--state", "SENT", "--note", "x")
	is.Equal(r.code, 3)                                 // an unknown task changes nothing
	oneErrorLine(t, r)                                  // one line
	is.True(strings.Contains(r.stderr, "no such task")) // naming the case

	r = c.ok("review")
	is.Equal(r.stdout, "") // resolved tasks leave the review list
	r = c.ok("status")
	is.True(strings.Contains(r.stdout, "parked tasks:"))                                           // the table has the parked count
	is.True(strings.Contains(r.stdout, "not sent, but a late answer or a receipt says accepted:")) // and the contradicted ones
	r = c.ok("status", "--json")
	is.True(strings.Contains(r.stdout, `"late_accepted":0`)) // for scripts too
}

// TestCreateBodyFromStdin reads the body from stdin, bounded by the service's limit.
func TestCreateBodyFromStdin(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)

	r := c.run("hello from stdin", "create", "--user", "u1", "--event-key", "k1", "--body", "-")
	is.Equal(r.code, 0) // read from stdin
	var out createOutput
	decode(t, r.stdout, &out)
	is.True(out.Created) // created (without tasks: no preference)
	var body string
	is.NoErr(pool.QueryRow(context.Background(), `SELECT body FROM notification WHERE id = $1`, out.NotificationID).Scan(&body)) // stored
	is.Equal(body, "hello from stdin")                                                                                           // verbatim

	r = c.run(strings.Repeat("x", service.MaxBodyBytes+1), "create", "--user", "u1", "--event-key", "k2", "--body", "-")
	is.Equal(r.code, 2)                          // oversize is bad input
	oneErrorLine(t, r)                           // one line
	is.True(strings.Contains(r.stderr, "limit")) // naming the limit
	is.Equal(rowCounts(t, pool)[1], int64(1))    // and nothing written
}
