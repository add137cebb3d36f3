package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// show runs notifier show with args, requires exit 0 and decodes its one object strictly.
func (c notifierCLI) show(args ...string) service.NotificationReport {
	c.t.Helper()
	var report service.NotificationReport
	decode(c.t, c.ok(append([]string{"show"}, args...)...).stdout, &report)
	return report
}

// jsonOf is v as printed.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestShowFollowsAnEvent: a script follows the event it created. Before any worker: the notification
// with one PENDING task per enabled channel and no attempt. After a worker delivered the push task: its
// SEND attempt with the outcome, the sms task still PENDING. --notification N shows the same as
// --user --event-key.
func TestShowFollowsAnEvent(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	c.ok("pref", "set", "--user", "u1", "--channel", "sms", "--address", "+15550100")
	var created createOutput
	decode(t, c.ok("create", "--user", "u1", "--event-key", "order-1", "--body", "shipped", "--ttl", "2h").stdout, &created)
	is.Equal(len(created.Tasks), 2) // push and sms

	before := c.show("--user", "u1", "--event-key", "order-1")
	is.Equal(before.ID, created.NotificationID)
	is.Equal(before.UserID, "u1")
	is.Equal(before.EventKey, "order-1")
	is.Equal(before.ExpiresAt.Sub(before.CreatedAt).Hours(), 2.0) // the ttl
	is.Equal(before.CancelledAt, nil)                             // not cancelled
	is.Equal(len(before.Tasks), 2)
	for i, task := range before.Tasks {
		is.Equal(task.ID, created.Tasks[i].TaskID) // create's tasks, in its order
		is.Equal(task.Channel, created.Tasks[i].Channel)
		is.Equal(task.Ref, created.Tasks[i].Ref)
		is.Equal(task.State, delivery.StatePending) // waiting for a worker
		is.Equal(task.AttemptCount, 0)
		is.True(!task.NeedsReview)
		is.Equal(task.LastError, nil)
		is.Equal(task.Attempts, []service.AttemptRecord{}) // no attempt yet
	}
	raw := c.ok("show", "--user", "u1", "--event-key", "order-1").stdout
	is.True(strings.Contains(raw, `"attempts":[]`))     // an empty list, not null, for a script
	is.True(strings.Contains(raw, `"last_error":null`)) // and the key present
	is.True(strings.Contains(raw, `"cancelled_at":null`))
	is.True(!strings.Contains(raw, "shipped")) // the body is not printed

	r := c.run("", "work", "--once", "--worker-id", "w-show", "--channel", "push=idempotent,"+push.URL())
	is.Equal(r.code, 0) // the push task delivered
	after := c.show("--user", "u1", "--event-key", "order-1")
	is.Equal(len(after.Tasks), 2)
	byChannel := map[string]service.TaskReport{}
	for _, task := range after.Tasks {
		byChannel[task.Channel] = task
	}
	sent := byChannel["push"]
	is.Equal(sent.State, delivery.StateSent)
	is.Equal(sent.AttemptCount, 1)
	is.Equal(len(sent.Attempts), 1) // its attempt, with what it observed
	is.Equal(sent.Attempts[0].No, 1)
	is.Equal(sent.Attempts[0].Action, delivery.ActionSend)
	is.Equal(sent.Attempts[0].Worker, "w-show")
	is.Equal(sent.Attempts[0].Outcome, delivery.OutcomeAccepted)
	is.True(sent.Attempts[0].FinishedAt != nil)
	is.True(sent.Attempts[0].ProviderMsgID != "")
	is.Equal(push.Outbound(sent.Ref), 1)
	attempts, err := service.NewNotifier(pool).Attempts(t.Context(), sent.ID)
	is.NoErr(err)
	is.Equal(jsonOf(t, sent.Attempts), jsonOf(t, attempts)) // verbatim, as review prints them
	waiting := byChannel["sms"]
	is.Equal(waiting.State, delivery.StatePending) // no sms worker ran
	is.Equal(waiting.Attempts, []service.AttemptRecord{})

	byID := c.show("--notification", strconv.FormatInt(created.NotificationID, 10))
	is.Equal(byID, after) // the same notification, the same state
}

// TestShowUnknownNotificationExits3: no such notification, by either selector, is exit 3 with one line
// naming what was asked for, and nothing on stdout.
func TestShowUnknownNotificationExits3(t *testing.T) {
	t.Parallel()
	c, _ := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	c.ok("create", "--user", "u1", "--event-key", "order-1", "--body", "shipped")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--user", "u1", "--event-key", "order-2"}, `show: no such notification: --user "u1" --event-key "order-2"`},
		{[]string{"--user", "u2", "--event-key", "order-1"}, `show: no such notification: --user "u2" --event-key "order-1"`},
		{[]string{"--notification", "999"}, `show: no such notification: --notification 999`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", append([]string{"show"}, tc.args...)...)
			is.Equal(r.code, 3) // nothing found
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, tc.want))
			is.Equal(r.stdout, "")
		})
	}
}

// TestShowNeedsExactlyOneSelector: both selectors, neither, half of --user/--event-key, or a bad value
// is a usage error (exit 2) that says what to give, before any database call.
func TestShowNeedsExactlyOneSelector(t *testing.T) {
	t.Parallel()
	c := notifierCLI{t: t, dbURL: "postgres://nobody@127.0.0.1:1/none"} // never reached: refused first
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "show: name the notification: --notification N, or --user U --event-key K"},
		{[]string{"--notification", "1", "--user", "u1", "--event-key", "k"}, "show: give --notification, or --user with --event-key, not both"},
		{[]string{"--notification", "1", "--event-key", "k"}, "not both"},
		{[]string{"--user", "u1"}, "show: --user needs --event-key"},
		{[]string{"--event-key", "k"}, "show: --event-key needs --user"},
		{[]string{"--notification", "0"}, "show: invalid --notification 0"},
		{[]string{"--notification", "x"}, `invalid value "x" for flag -notification`},
		{[]string{"--user", " ", "--event-key", "k"}, "invalid user: must not be empty"},
		{[]string{"--user", "u1", "--event-key", "k", "extra"}, `show: unexpected argument "extra"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", append([]string{"show"}, tc.args...)...)
			is.Equal(r.code, 2) // a usage error
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, tc.want)) // saying what to give
			is.Equal(r.stdout, "")
		})
	}
}

// TestShowNeedsTheOperatorRole: show reads attempts, which the creator role may not (schema/002): a
// creator is told the role to grant (exit 1), not shown a notification without its history, even one
// with no task; the operator sees a parked task as review does; the worker, which reads the same
// tables for its claims, may too (docs/operations.md#following-one-event-notifier-show).
func TestShowNeedsTheOperatorRole(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := parkedTask(t, pool)
	task, err := service.NewNotifier(pool).Task(t.Context(), id)
	is.New(t).NoErr(err)
	show := []string{"show", "--notification", strconv.FormatInt(task.NotificationID, 10)}
	var created createOutput // no channel enabled for u2: a notification without tasks
	decode(t, c.ok("create", "--user", "u2", "--event-key", "k", "--body", "b").stdout, &created)
	is.New(t).Equal(len(created.Tasks), 0)

	creator := c.loginAs(pool, service.RoleCreator)
	for _, args := range [][]string{show, {"show", "--user", "u2", "--event-key", "k"}} {
		t.Run(service.RoleCreator+"/"+strings.Join(args[1:], " "), func(t *testing.T) {
			is := is.New(t)
			r := creator.in(t).run("", args...)
			is.Equal(r.code, 1) // a runtime error
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, "show needs the notifier_operator role: permission denied for table delivery_attempt"))
			is.Equal(r.stdout, "")
		})
	}
	is := is.New(t)
	operator := c.loginAs(pool, service.RoleOperator)
	report := operator.show(show[1:]...)
	is.Equal(len(report.Tasks), 1)
	parked := report.Tasks[0]
	is.Equal(parked.ID, id)
	is.Equal(parked.State, delivery.StateUnknown) // parked
	is.True(parked.NeedsReview)
	is.Equal(len(parked.Attempts), 1)
	is.Equal(parked.Attempts[0].Outcome, delivery.OutcomeTimeout) // the attempt that parked it
	noTask := operator.show("--user", "u2", "--event-key", "k")
	is.Equal(noTask.ID, created.NotificationID)
	is.Equal(noTask.Tasks, []service.TaskReport{}) // an empty list

	worker := c.loginAs(pool, service.RoleWorker)
	is.Equal(jsonOf(t, worker.show(show[1:]...)), jsonOf(t, report)) // the worker reads the same
}
