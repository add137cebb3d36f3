package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// loginAs creates a LOGIN role that is a member of group (one of schema/002's roles) with newLogin, and
// returns the CLI connecting as it to c's database.
func (c notifierCLI) loginAs(pool *pgxpool.Pool, group string) notifierCLI {
	c.t.Helper()
	name, password := newLogin(c.t, pool, group)
	u, err := url.Parse(c.dbURL)
	if err != nil {
		c.t.Fatal(err)
	}
	u.User = url.UserPassword(name, password)
	c.dbURL = u.String()
	return c
}

// newLogin creates a LOGIN role that is a member of group, for this test only, and returns its name and
// password. Roles are cluster-wide: the name is random and the role is dropped at the end of the test.
func newLogin(t *testing.T, pool *pgxpool.Pool, group string) (name, password string) {
	t.Helper()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name, password = "notifier_cli_"+hex.EncodeToString(suffix), hex.EncodeToString(suffix)+"-pw"
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{name}.Sanitize()+` LOGIN PASSWORD '`+password+`' IN ROLE `+
		pgx.Identifier{group}.Sanitize()); err != nil {
		t.Fatalf("create login role in %s: %v", group, err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("drop login role %s: %v", name, err)
		}
	})
	return name, password
}

// parkedTask makes one parked push task of u1 (test-only SQL, as the owner, by the protocol's moves:
// claimed, timed out, parked) and returns its id.
func parkedTask(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	return parkedTaskOf(t, pool, "", 0)
}

// parkedTaskWithMsgID is parkedTask with the provider's message id its attempt recorded:
// what a receipt that carries no ref is matched by.
func parkedTaskWithMsgID(t *testing.T, pool *pgxpool.Pool, providerMsgID string) int64 {
	t.Helper()
	return parkedTaskOf(t, pool, providerMsgID, 0)
}

// parkedTaskSince is parkedTask with the task last changed (parked) ago.
func parkedTaskSince(t *testing.T, pool *pgxpool.Pool, ago time.Duration) int64 {
	t.Helper()
	return parkedTaskOf(t, pool, "", ago)
}

// parkedTaskOf makes the parked task with the provider's message id ("" none), parked ago.
func parkedTaskOf(t *testing.T, pool *pgxpool.Pool, providerMsgID string, ago time.Duration) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	err := pool.QueryRow(ctx, `
		WITH n AS (INSERT INTO notification (user_id, event_key, body, expires_at)
		           VALUES ('u1', 'parked-' || gen_random_uuid(), 'b', now() + interval '1 hour') RETURNING id)
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                           attempt_token, lease_owner, lease_until, provider_msg_id, updated_at)
		SELECT id, 'push', 'SENDING', 1, 3, NULL, gen_random_uuid(), 'w-test', now() + interval '1 hour', NULLIF($1, ''),
		       now() - make_interval(secs => $2) FROM n
		RETURNING id`, providerMsgID, ago.Seconds()).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		 SELECT id, 1, attempt_token, 'SEND', 'w-test' FROM delivery_task WHERE id = $1`,
		`UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now() WHERE task_id = $1`,
		`UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true, outcome_uncertain = true, uncertain_since = updated_at,
		        lease_owner = NULL, lease_until = NULL WHERE id = $1`,
	} {
		if _, err := pool.Exec(ctx, stmt, id); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return id
}

// TestResolveNeedsTheOperatorRole: resolve run by a user without the operator role is a permission
// problem (exit 1, naming the role and the missing privilege), not "resolved concurrently" (exit 3),
// and the task stays parked; with the role it resolves.
func TestResolveNeedsTheOperatorRole(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := parkedTask(t, pool)
	resolve := []string{"resolve", "--task", strconv.FormatInt(id, 10), "--state", "SENT", "--note", "seen in the channel console"}
	for _, group := range []string{service.RoleWorker, service.RoleCreator} {
		t.Run(group, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).loginAs(pool, group).run("", resolve...)
			is.Equal(r.code, 1) // a runtime error, not "nothing changed"
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, "resolve needs the notifier_operator role"))        // the role to grant
			is.True(strings.Contains(r.stderr, "permission denied for function notifier_resolve")) // and the missing privilege
			is.Equal(r.stdout, "")
			var parked bool
			is.NoErr(pool.QueryRow(context.Background(), `SELECT needs_review FROM delivery_task WHERE id = $1`, id).Scan(&parked))
			is.True(parked) // still parked
		})
	}
	is := is.New(t)
	r := c.loginAs(pool, service.RoleOperator).run("", resolve...)
	is.Equal(r.code, 0) // the operator resolves
	var out resolveOutput
	decode(t, r.stdout, &out)
	is.Equal(out, resolveOutput{TaskID: id, State: delivery.StateSent, Changed: true})
}

// TestWorkNeedsTheWorkerRole: work run by a user that may not claim (row-level security would show it
// no task, forever) says so at start and exits 1, without claiming or calling; with the role it delivers.
func TestWorkNeedsTheWorkerRole(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err)
	_, _, tasks, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "due-1", Body: "body", TTL: time.Hour, MaxAttempts: 3})
	is.New(t).NoErr(err) // a due task
	channel := "push=idempotent," + push.URL()
	for _, group := range []string{service.RoleOperator, service.RoleCreator} {
		for _, once := range []bool{true, false} {
			args, name := []string{"work", "--channel", channel}, "work"
			if once {
				args, name = append(args, "--once"), "work --once"
			}
			t.Run(group+"/"+name, func(t *testing.T) {
				is := is.New(t)
				r := c.in(t).loginAs(pool, group).run("", args...)
				is.Equal(r.code, 1) // refused at start, not NOTHING forever
				oneErrorLine(t, r)
				is.True(strings.Contains(r.stderr, "notifier: preflight worker role: "))      // the start-up check that failed
				is.True(strings.Contains(r.stderr, "work needs the notifier_worker role"))    // the role to grant
				is.True(strings.Contains(r.stderr, "GRANT notifier_worker TO notifier_cli_")) // and how
				is.Equal(r.stdout, "")
				is.Equal(push.TotalSends(), 0) // nothing called
			})
		}
	}
	is := is.New(t)
	task, err := n.Task(ctx, tasks[0].TaskID)
	is.NoErr(err)
	is.Equal(task.State, delivery.StatePending) // nothing claimed
	r := c.loginAs(pool, service.RoleWorker).run("", "work", "--once", "--channel", channel)
	is.Equal(r.code, 0) // the worker role delivers
	is.True(strings.Contains(r.stdout, `"result":"SENT"`))
}

// TestCreateNeedsTheCreatorRole: create run by a user without the creator role is a permission problem
// naming the role (exit 1) and writes nothing; with the role it creates.
func TestCreateNeedsTheCreatorRole(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	_, err := service.NewNotifier(pool).SetPreference(context.Background(), "u1", "push", "device-1", true)
	is.New(t).NoErr(err)
	before := rowCounts(t, pool)
	create := []string{"create", "--user", "u1", "--event-key", "k1", "--body", "b"}
	for _, group := range []string{service.RoleWorker, service.RoleOperator} {
		t.Run(group, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).loginAs(pool, group).run("", create...)
			is.Equal(r.code, 1) // a runtime error
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, "create needs the notifier_creator role: permission denied for table notification"))
			is.Equal(rowCounts(t, pool), before) // nothing written
		})
	}
	is := is.New(t)
	r := c.loginAs(pool, service.RoleCreator).run("", create...)
	is.Equal(r.code, 0) // the creator creates
	is.True(strings.Contains(r.stdout, `"created":true`))
	is.Equal(rowCounts(t, pool)[2], before[2]+1) // one task
}

// TestReviewAndStatusNeedTheOperatorRole: review and status run by a user whose role may not read what
// they show exit 1 naming the operator role (they printed the database's "permission denied for table
// delivery_attempt" alone); with the role they print.
func TestReviewAndStatusNeedTheOperatorRole(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := parkedTask(t, pool)
	for _, cmd := range []string{"review", "status"} {
		for _, group := range []string{service.RoleCreator, service.RoleWorker} {
			t.Run(cmd+"/"+group, func(t *testing.T) {
				is := is.New(t)
				r := c.in(t).loginAs(pool, group).run("", cmd)
				is.Equal(r.code, 1) // a runtime error
				oneErrorLine(t, r)
				is.True(strings.Contains(r.stderr, cmd+" needs the notifier_operator role: permission denied for ")) // the role to grant, and the privilege missing (a table, or schema/004's function)
				is.Equal(r.stdout, "")
			})
		}
	}
	is := is.New(t)
	operator := c.loginAs(pool, service.RoleOperator)
	r := operator.run("", "review")
	is.Equal(r.code, 0)                                                             // the operator reviews
	is.True(strings.Contains(r.stdout, `"task_id":`+strconv.FormatInt(id, 10)+`,`)) // the parked task
	r = operator.run("", "status")
	is.Equal(r.code, 0)                           // and sees the status
	is.True(strings.Contains(r.stdout, "parked")) // with the parked count
}
