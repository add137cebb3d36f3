package service_test

// A task's channel reference is random and never reused (delivery_task.ref). Task ids are not unique across a
// database's life: a restore from a backup, or a failover to a standby that had not received the last
// transactions, hands the lost ids out again while the channels still remember the keys they saw. These
// tests play both against the fakes, which remember every key and reference for as long as they run,
// as a provider does within its retention window.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

var uuidRef = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// New tasks get a random reference, chosen by the database, returned by create, and used for the key.
func TestTaskRefIsRandomAndSentAsTheKey(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.create("u1", "e1", time.Hour, 3)
	is.Equal(len(tasks), 2)
	is.True(uuidRef.MatchString(tasks[0].Ref)) // a UUID
	is.True(tasks[0].Ref != tasks[1].Ref)      // one per task
	is.Equal(e.ref(tasks[0].TaskID), tasks[0].Ref)
	_, created, again, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "e1", Body: "body of e1", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)
	is.True(!created)
	is.Equal(again, tasks) // a duplicate submitter sees the same references

	d := e.dispatcher(dcfg{})
	for range tasks {
		is.Equal(runOnce(t, d).Kind, service.ResultSent)
	}
	sent := e.push.Messages(tasks[0].Ref)
	is.Equal(len(sent), 1)                                                                     // filed under the task's reference
	is.Equal(sent[0].Key, delivery.IdempotencyKey(tasks[0].Ref))                               // with its key ntf-<ref>
	is.Equal(sent[0].Key, "ntf-"+tasks[0].Ref)                                                 //
	is.Equal(e.sms.Outbound(tasks[1].Ref), 1)                                                  // the sms task too
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE ref LIKE 'task-%'`), int64(0)) // none derived from an id
}

// The restore-from-backup case: a backup is taken, three notifications are delivered, the backup is
// restored (their rows and ids are gone; the channels remember their keys), and three new notifications
// get the same ids. They must be sent as new messages, ACCEPTED, not answered with the lost ones'
// replays. The negative control derives the reference from the id, as before refs were random: every new
// push task is recorded SENT on an ACCEPTED_REPLAY, and no message of theirs went out.
func TestRestoreFromBackupSendsNewMessages(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := map[bool]string{false: "random refs", true: "negative control: refs from ids"}[legacy]
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			if legacy {
				e.refsFromIDs()
			}
			e.w.User("u1", "push", "sms")
			dump := e.dump()

			lost := e.deliverThree("before the restore")
			restored := e.onDatabase(e.restore(dump))
			fresh := restored.deliverThree("after the restore")
			for i := range fresh {
				is.Equal(fresh[i].TaskID, lost[i].TaskID) // the restore handed the same ids out again
			}
			restored.checkNewMessages(is, lost, fresh, legacy)
		})
	}
}

// The sequence-rewind case, as a failover to a standby that lacked the last transactions leaves it: the
// newest notification's rows are gone and the identity sequences are back where they were before it.
func TestSequenceRewindSendsNewMessages(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := map[bool]string{false: "random refs", true: "negative control: refs from ids"}[legacy]
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			if legacy {
				e.refsFromIDs()
			}
			e.w.User("u1", "push", "sms")
			lost := e.deliverThree("before the failover")
			e.forget(lost)
			fresh := e.deliverThree("after the failover")
			for i := range fresh {
				is.Equal(fresh[i].TaskID, lost[i].TaskID) // the rewound sequence handed the same ids out again
			}
			e.checkNewMessages(is, lost, fresh, legacy)
		})
	}
}

// sentTask is a delivered task and the body it was sent with.
type sentTask struct {
	service.TaskRef
	body string
}

// deliverThree submits three events (push and sms each) with bodies of their own and delivers them.
func (e *env) deliverThree(when string) []sentTask {
	e.t.Helper()
	var tasks []sentTask
	for i := range 3 {
		key, body := fmt.Sprintf("ev-%d", i), fmt.Sprintf("message %d, %s", i, when)
		_, created, ts, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: key, Body: body, TTL: time.Hour, MaxAttempts: 3})
		if err != nil || !created {
			e.t.Fatalf("create %s: created=%v err=%v", key, created, err)
		}
		for _, tk := range ts {
			tasks = append(tasks, sentTask{TaskRef: tk, body: body})
		}
	}
	d := e.dispatcher(dcfg{})
	for range tasks {
		if res := runOnce(e.t, d); res.Kind != service.ResultSent {
			e.t.Fatalf("deliver %s: %+v", when, res)
		}
	}
	return tasks
}

// checkNewMessages checks that every fresh task reached its channel as a new message, with its own
// body; with legacy references, that the push tasks were answered with the lost tasks' replays instead.
func (e *env) checkNewMessages(is *is.I, lost, fresh []sentTask, legacy bool) {
	e.t.Helper()
	for i, tk := range fresh {
		outcomes := e.outcomes(tk.TaskID)
		fake := map[string]*fakes.Channel{"push": e.push, "sms": e.sms}[tk.Channel]
		switch {
		case !legacy:
			is.True(tk.Ref != lost[i].Ref)                                   // a new reference
			is.Equal(outcomes, []delivery.Outcome{delivery.OutcomeAccepted}) // sent as a new message
			is.Equal(fake.Outbound(tk.Ref), 1)                               // which went out
			is.Equal(bodies(tk.Ref, e.push, e.sms), []string{tk.body})       // with its own body
		case tk.Channel == "push": // the damage
			is.Equal(tk.Ref, lost[i].Ref)                                          // the lost task's reference
			is.Equal(outcomes, []delivery.Outcome{delivery.OutcomeAcceptedReplay}) // "sent": a replay
			is.Equal(fake.Outbound(tk.Ref), 1)                                     // of the lost message only
			is.Equal(bodies(tk.Ref, e.push), []string{lost[i].body})               // this one never went out
		default: // sms ignores keys: a second message under the same reference, which a query cannot tell apart
			is.Equal(fake.Outbound(tk.Ref), 2)
		}
	}
}

// bodies lists the bodies of the messages the fakes accepted under ref.
func bodies(ref string, channels ...*fakes.Channel) []string {
	var out []string
	for _, c := range channels {
		for _, m := range c.Messages(ref) {
			out = append(out, m.Body)
		}
	}
	return out
}

// refsFromIDs makes new tasks take task-<id> as their reference, as every task did before refs were random:
// the unsafe variant for the negative controls (test-only, on the test's own database).
func (e *env) refsFromIDs() {
	e.t.Helper()
	for _, sql := range []string{
		`CREATE FUNCTION test_ref_from_id() RETURNS trigger LANGUAGE plpgsql AS
		 $$BEGIN NEW.ref := 'task-' || NEW.id; RETURN NEW; END$$`,
		`CREATE TRIGGER test_ref_from_id BEFORE INSERT ON delivery_task FOR EACH ROW EXECUTE FUNCTION test_ref_from_id()`,
	} {
		if _, err := e.pool.Exec(e.ctx, sql); err != nil {
			e.t.Fatal(err)
		}
	}
}

// forget removes the given tasks, their attempts and notifications, and rewinds the identity sequences
// to the first id removed: what a failover that lost these transactions leaves behind.
func (e *env) forget(tasks []sentTask) {
	e.t.Helper()
	ids := make([]int64, len(tasks))
	for i, tk := range tasks {
		ids[i] = tk.TaskID
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	for _, sql := range []string{
		`SET LOCAL session_replication_role = replica`, // no trigger: these deletes are no move of the protocol
		`CREATE TEMP TABLE lost ON COMMIT DROP AS
		 SELECT t.id AS task_id, t.notification_id FROM delivery_task t WHERE t.id = ANY ($1)`,
	} {
		args := []any{}
		if len(sql) > 60 {
			args = append(args, ids)
		}
		if _, err := tx.Exec(e.ctx, sql, args...); err != nil {
			e.t.Fatal(err)
		}
	}
	for _, sql := range []string{
		`DELETE FROM delivery_attempt WHERE task_id IN (SELECT task_id FROM lost)`,
		`DELETE FROM delivery_task_key WHERE task_id IN (SELECT task_id FROM lost)`, // (no cascade under replica)
		`DELETE FROM delivery_task WHERE id IN (SELECT task_id FROM lost)`,
		`DELETE FROM notification WHERE id IN (SELECT notification_id FROM lost)`,
		`SELECT setval(pg_get_serial_sequence('delivery_task', 'id'), (SELECT min(task_id) FROM lost), false)`,
		`SELECT setval(pg_get_serial_sequence('notification', 'id'), (SELECT min(notification_id) FROM lost), false)`,
		`SELECT setval(pg_get_serial_sequence('delivery_attempt', 'id'), (SELECT coalesce(max(id), 1) FROM delivery_attempt))`,
	} {
		if _, err := tx.Exec(e.ctx, sql); err != nil {
			e.t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

// dump takes a backup of the test's database with pg_dump (custom format) and returns its path.
func (e *env) dump() string {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "backup.dump")
	e.pgTool("pg_dump", "--format=custom", "--file="+path, e.pool.Config().ConnString())
	return path
}

// restore restores a backup into a new database of the same server and returns its URL.
func (e *env) restore(dump string) string {
	e.t.Helper()
	base, err := url.Parse(e.pool.Config().ConnString())
	if err != nil {
		e.t.Fatal(err)
	}
	name := filepath.Base(base.Path) + "_restored"
	admin := *base
	admin.Path = "/postgres"
	adminPool, err := pgxpool.New(e.ctx, admin.String())
	if err != nil {
		e.t.Fatal(err)
	}
	defer adminPool.Close()
	if _, err := adminPool.Exec(e.ctx, `CREATE DATABASE `+name); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		p, err := pgxpool.New(context.Background(), admin.String())
		if err == nil {
			_, _ = p.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
			p.Close()
		}
	})
	restored := *base
	restored.Path = "/" + name
	e.pgTool("pg_restore", "--exit-on-error", "--dbname="+restored.String(), dump)
	return restored.String()
}

func (e *env) pgTool(name string, args ...string) {
	e.t.Helper()
	dir, _, err := pgtest.FindBinDir()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// onDatabase is e on another database of the same server, with the same fakes (channels outlive a
// restore).
func (e *env) onDatabase(dbURL string) *env {
	e.t.Helper()
	other := *e
	pool, err := pgxpool.New(e.ctx, dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	service.ConfigureWorkerConn(cfg.ConnConfig)
	workerPool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(workerPool.Close)
	other.pool, other.workerPool, other.n = pool, workerPool, service.NewNotifier(pool)
	return &other
}
