package service_test

// Create in the caller's own transaction (schema/005 notifier_create, Notifier.CreateTx and
// CreateBatchTx), and the channels a submission names: commit, rollback and savepoints, R1 across
// concurrent transactions, the isolation levels, the roles, and the create paths agreeing.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

func ctxReq(user, key string) service.CreateRequest {
	return service.CreateRequest{UserID: user, EventKey: key, Body: "body of " + key, TTL: time.Hour, MaxAttempts: 3}
}

// beginTx begins a transaction on pool that is rolled back when the test ends (a no-op after a commit),
// so that a failed check does not leave its connection held and the pool's Close waiting for it.
func beginTx(t *testing.T, pool *pgxpool.Pool, opts pgx.TxOptions) pgx.Tx {
	t.Helper()
	tx, err := pool.BeginTx(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// createTxCount counts the notifications of (user, key) and their tasks, as the owner sees them.
func (e *env) createTxCount(user, key string) (notifications, tasks int64) {
	e.t.Helper()
	notifications = e.scalar(`SELECT count(*) FROM notification WHERE user_id = $1 AND event_key = $2`, user, key)
	tasks = e.scalar(`SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
		WHERE n.user_id = $1 AND n.event_key = $2`, user, key)
	return notifications, tasks
}

// TestCreateTxCommitRollbackAndSavepoints: as notifier_creator, a create commits or rolls back with the
// caller's transaction, at any savepoint level.
func TestCreateTxCommitRollbackAndSavepoints(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	n := service.NewNotifier(creator)

	// Committed: the notification and one task per enabled channel.
	tx := beginTx(t, creator, pgx.TxOptions{})
	c, err := n.CreateTx(e.ctx, tx, ctxReq("u1", "committed"))
	is.NoErr(err) // create in the caller's transaction
	is.True(c.Created)
	is.Equal(len(c.Tasks), 2) // push and sms
	is.NoErr(tx.Commit(e.ctx))
	nn, nt := e.createTxCount("u1", "committed")
	is.Equal([2]int64{nn, nt}, [2]int64{1, 2}) // kept

	// Rolled back: nothing left behind.
	tx = beginTx(t, creator, pgx.TxOptions{})
	c, err = n.CreateTx(e.ctx, tx, ctxReq("u1", "rolled-back"))
	is.NoErr(err)
	is.True(c.Created) // created, as far as this transaction knows
	is.NoErr(tx.Rollback(e.ctx))
	nn, nt = e.createTxCount("u1", "rolled-back")
	is.Equal([2]int64{nn, nt}, [2]int64{0, 0}) // the rollback took it all

	// Savepoints: a released one keeps its create, a rolled-back one leaves nothing, and the event of
	// the rolled-back one can be created again in the same transaction.
	tx = beginTx(t, creator, pgx.TxOptions{})
	kept, err := tx.Begin(e.ctx) // SAVEPOINT
	is.NoErr(err)
	c, err = n.CreateTx(e.ctx, kept, ctxReq("u1", "in-released-savepoint"))
	is.NoErr(err) // a create inside a savepoint (refused by the policy before schema/005)
	is.True(c.Created)
	is.Equal(len(c.Tasks), 2)
	keptID := c.NotificationID
	is.NoErr(kept.Commit(e.ctx)) // RELEASE SAVEPOINT
	dropped, err := tx.Begin(e.ctx)
	is.NoErr(err)
	nested, err := dropped.Begin(e.ctx) // a savepoint inside a savepoint
	is.NoErr(err)
	c, err = n.CreateTx(e.ctx, nested, ctxReq("u1", "in-rolled-back-savepoint"))
	is.NoErr(err)
	is.True(c.Created)
	is.Equal(len(c.Tasks), 2)
	is.NoErr(nested.Commit(e.ctx))
	is.NoErr(dropped.Rollback(e.ctx)) // ROLLBACK TO SAVEPOINT: the nested create goes with it
	again, err := n.CreateTx(e.ctx, tx, ctxReq("u1", "in-released-savepoint"))
	is.NoErr(err)
	is.True(!again.Created)                // the released savepoint's notification is this transaction's
	is.Equal(again.NotificationID, keptID) // and the same one
	is.NoErr(tx.Commit(e.ctx))
	nn, nt = e.createTxCount("u1", "in-released-savepoint")
	is.Equal([2]int64{nn, nt}, [2]int64{1, 2}) // released: kept
	nn, nt = e.createTxCount("u1", "in-rolled-back-savepoint")
	is.Equal([2]int64{nn, nt}, [2]int64{0, 0}) // rolled back: nothing left

	// And later, in a new transaction, the same event answers created=false with the same tasks.
	tx = beginTx(t, creator, pgx.TxOptions{})
	dup, err := n.CreateTx(e.ctx, tx, ctxReq("u1", "committed"))
	is.NoErr(err)
	is.True(!dup.Created)
	is.Equal(len(dup.Tasks), 2)
	is.NoErr(tx.Commit(e.ctx))
}

// TestCreateTxSavepointTaskPolicy: a creator may add a task to a notification that a savepoint of its
// own transaction inserted, and still not to someone else's committed one, even from a savepoint.
func TestCreateTxSavepointTaskPolicy(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	old := e.create("u1", "old", time.Hour, 3)
	oldID := e.scalar(`SELECT notification_id FROM delivery_task WHERE id = $1`, old[0].TaskID)
	_, err := e.pool.Exec(e.ctx, `DELETE FROM delivery_task WHERE notification_id = $1`, oldID)
	is.NoErr(err) // the old notification has no task now: a creator must not add one

	tx := beginTx(t, creator, pgx.TxOptions{})
	sp, err := tx.Begin(e.ctx)
	is.NoErr(err)
	var id int64
	is.NoErr(sp.QueryRow(e.ctx, `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'own', 'b', now() + interval '1 hour') RETURNING id`).Scan(&id)) // in a savepoint
	_, err = sp.Exec(e.ctx, `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'push', 3)`, id)
	is.NoErr(err) // its own notification, from inside the savepoint
	is.NoErr(sp.Commit(e.ctx))
	_, err = tx.Exec(e.ctx, `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'sms', 3)`, id)
	is.NoErr(err) // and after the savepoint was released, from the top level

	sp, err = tx.Begin(e.ctx)
	is.NoErr(err)
	_, err = sp.Exec(e.ctx, `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'push', 3)`, oldID)
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr))       // an old notification, from a savepoint
	is.Equal(pgErr.Code, sqlInsufficient) // refused by row-level security
	t.Logf("refused: %s", pgErr.Message)  // new row violates row-level security policy ...
	is.NoErr(sp.Rollback(e.ctx))
}

// TestCreateTxConcurrentOneCreated: ten transactions submit one event at once; exactly one reports
// created, all get the same notification, and it has one task per channel.
func TestCreateTxConcurrentOneCreated(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	cfg := creator.Config()
	cfg.MaxConns = 10
	wide, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err)
	defer wide.Close()
	n := service.NewNotifier(wide)

	const submitters = 10
	// Every transaction is open, holding a connection, before any of them creates.
	var open, start sync.WaitGroup
	open.Add(submitters)
	start.Add(1)
	results := make([]service.Created, submitters)
	errs := make([]error, submitters)
	var done sync.WaitGroup
	for i := range submitters {
		done.Add(1)
		go func() {
			defer done.Done()
			tx, err := wide.Begin(e.ctx)
			open.Done()
			if err != nil {
				errs[i] = err
				return
			}
			defer func() { _ = tx.Rollback(e.ctx) }()
			start.Wait()
			results[i], errs[i] = n.CreateTx(e.ctx, tx, ctxReq("u1", "one-event"))
			if errs[i] == nil {
				errs[i] = tx.Commit(e.ctx)
			}
		}()
	}
	open.Wait()
	start.Done()
	done.Wait()
	created := 0
	for i := range submitters {
		is.NoErr(errs[i]) // every submitter gets an answer
		if results[i].Created {
			created++
		}
		is.Equal(results[i].NotificationID, results[0].NotificationID) // one notification
		is.Equal(len(results[i].Tasks), 2)                             // and its two tasks, to everyone
	}
	is.Equal(created, 1) // exactly one created
	nn, nt := e.createTxCount("u1", "one-event")
	is.Equal([2]int64{nn, nt}, [2]int64{1, 2})
}

// TestCreateTxWaiterCreatesAfterRollback: a second transaction waits on the first one's uncommitted
// create of the same event; the first rolls back, and the waiter creates.
func TestCreateTxWaiterCreatesAfterRollback(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	n := service.NewNotifier(creator)

	tx1 := beginTx(t, creator, pgx.TxOptions{})
	first, err := n.CreateTx(e.ctx, tx1, ctxReq("u1", "contended"))
	is.NoErr(err)
	is.True(first.Created)

	tx2 := beginTx(t, creator, pgx.TxOptions{})
	var pid2 int32
	is.NoErr(tx2.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid2))
	type answer struct {
		c   service.Created
		err error
	}
	second := make(chan answer, 1)
	go func() {
		c, err := n.CreateTx(e.ctx, tx2, ctxReq("u1", "contended"))
		second <- answer{c, err}
	}()
	// tx2 waits for tx1's transaction id: the unique index's check of the uncommitted row.
	e.waitDB(`EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted)`, pid2)
	is.NoErr(tx1.Rollback(e.ctx))
	a := <-second
	is.NoErr(a.err)                                     // the waiter got an answer
	is.True(a.c.Created)                                // and created: the first one is gone
	is.True(a.c.NotificationID != first.NotificationID) // a new notification
	is.Equal(len(a.c.Tasks), 2)                         // with its tasks
	is.NoErr(tx2.Commit(e.ctx))
	nn, nt := e.createTxCount("u1", "contended")
	is.Equal([2]int64{nn, nt}, [2]int64{1, 2})
}

// TestCreateTxRepeatableRead: at REPEATABLE READ and SERIALIZABLE, a create answers right (a new event,
// an event the snapshot sees) or, when the winner committed after the snapshot, fails with a
// serialization failure that names the isolation level; never no row or a wrong created.
func TestCreateTxRepeatableRead(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	n := service.NewNotifier(creator)
	before := e.create("u1", "before", time.Hour, 3)
	for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(level), func(t *testing.T) {
			is := is.New(t)
			tx := beginTx(t, creator, pgx.TxOptions{IsoLevel: level})
			var one int
			is.NoErr(tx.QueryRow(e.ctx, `SELECT 1`).Scan(&one)) // the snapshot is taken

			c, err := n.CreateTx(e.ctx, tx, ctxReq("u1", "before"))
			is.NoErr(err)                                 // an event the snapshot sees
			is.True(!c.Created)                           // is read back
			is.Equal(c.Tasks[0].TaskID, before[0].TaskID) // the existing one
			c, err = n.CreateTx(e.ctx, tx, ctxReq("u1", "new-"+string(level)))
			is.NoErr(err)      // a new event
			is.True(c.Created) // is created

			key := "after-snapshot-" + strings.ReplaceAll(string(level), " ", "-")
			e.create("u1", key, time.Hour, 3) // committed after tx's snapshot
			sp, err := tx.Begin(e.ctx)
			is.NoErr(err)
			_, err = n.CreateTx(e.ctx, sp, ctxReq("u1", key))
			var pgErr *pgconn.PgError
			is.True(errors.As(err, &pgErr))                                          // refused, not answered
			is.Equal(pgErr.Code, "40001")                                            // a serialization failure: retry the transaction
			is.True(strings.Contains(pgErr.Message, strings.ToUpper(string(level)))) // naming the isolation level
			t.Logf("%s: %s (hint: %s)", level, pgErr.Message, pgErr.Hint)
			is.NoErr(sp.Rollback(e.ctx))
			is.NoErr(tx.Commit(e.ctx))
			nn, nt := e.createTxCount("u1", key)
			is.Equal([2]int64{nn, nt}, [2]int64{1, 2}) // the winner alone
		})
	}
}

// TestCreateTxRoles: notifier_create runs with the caller's rights; a worker may not execute it.
func TestCreateTxRoles(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	worker := secRolePool(t, e, "notifier_worker")
	tx := beginTx(t, worker, pgx.TxOptions{})
	_, err := service.NewNotifier(worker).CreateTx(e.ctx, tx, ctxReq("u1", "by-worker"))
	is.True(errors.Is(err, service.ErrPermission))                     // refused
	is.True(strings.Contains(err.Error(), "notifier_creator"))         // naming the role it needs
	is.True(strings.Contains(err.Error(), "function notifier_create")) // for the function
	t.Logf("worker: %v", err)
	nn, _ := e.createTxCount("u1", "by-worker")
	is.Equal(nn, int64(0))

	var invoker bool
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT NOT prosecdef FROM pg_proc WHERE proname = 'notifier_create'`).Scan(&invoker))
	is.True(invoker) // SECURITY INVOKER: the caller's grants and policies apply
	var public bool
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT bool_or(has_function_privilege('public', p.oid, 'EXECUTE')) FROM pg_proc p WHERE p.proname = 'notifier_create'`).Scan(&public))
	is.True(!public) // not for everyone
}

// TestNotifierCreateSQL: the function called from SQL as a script would, with its defaults, and its
// refusals naming the parameter, before anything is written.
func TestNotifierCreateSQL(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	var id int64
	var created bool
	is.NoErr(creator.QueryRow(e.ctx, `SELECT notification_id, created FROM notifier_create(user_id => 'u1', event_key => 'k', body => 'b')`).Scan(&id, &created))
	is.True(created)
	var ttl time.Duration
	var maxAttempts int
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT n.expires_at - n.created_at, t.max_attempts FROM notification n
		JOIN delivery_task t ON t.notification_id = n.id WHERE n.id = $1 LIMIT 1`, id).Scan(&ttl, &maxAttempts))
	is.Equal(ttl, 24*time.Hour) // the default ttl is create's
	is.Equal(maxAttempts, 3)    // and so is the default max_attempts

	cases := []struct{ args, param string }{
		{`user_id => ' ', event_key => 'x', body => 'b'`, "user_id"},
		{`user_id => repeat('u', 201), event_key => 'x', body => 'b'`, "user_id"},
		{`user_id => 'u1', event_key => '', body => 'b'`, "event_key"},
		{`user_id => 'u1', event_key => NULL, body => 'b'`, "event_key"},
		{`user_id => 'u1', event_key => 'x', body => E' \n'`, "body"},
		{`user_id => 'u1', event_key => 'x', body => repeat('b', 65537)`, "body"},
		{`user_id => 'u1', event_key => 'x', body => 'b', ttl => interval '0.5 milliseconds'`, "ttl"},
		{`user_id => 'u1', event_key => 'x', body => 'b', ttl => interval '366 days'`, "ttl"},
		{`user_id => 'u1', event_key => 'x', body => 'b', ttl => interval '-1 hour'`, "ttl"},
		{`user_id => 'u1', event_key => 'x', body => 'b', max_attempts => 0`, "max_attempts"},
		{`user_id => 'u1', event_key => 'x', body => 'b', max_attempts => 101`, "max_attempts"},
		{`user_id => 'u1', event_key => 'x', body => 'b', channels => '{}'`, "channels"},
		{`user_id => 'u1', event_key => 'x', body => 'b', channels => '{push,SMS}'`, "channels"},
		{`user_id => 'u1', event_key => 'x', body => 'b', channels => ARRAY['push', NULL]`, "channels"},
	}
	for _, c := range cases {
		_, err := creator.Exec(e.ctx, `SELECT * FROM notifier_create(`+c.args+`)`)
		var pgErr *pgconn.PgError
		is.True(errors.As(err, &pgErr))                                                         // refused
		is.Equal(pgErr.Code, "22023")                                                           // invalid_parameter_value
		is.True(strings.Contains(pgErr.Message, c.param))                                       // naming the parameter
		is.Equal(e.scalar(`SELECT count(*) FROM notification WHERE event_key = 'x'`), int64(0)) // nothing written
	}
	// The bounds themselves are accepted.
	is.NoErr(creator.QueryRow(e.ctx, `SELECT created FROM notifier_create(user_id => repeat('u', 200), event_key => repeat('k', 200),
		body => repeat('b', 65536), ttl => interval '365 days', max_attempts => 100, channels => '{push}')`).Scan(&created))
	is.True(created)
	is.NoErr(creator.QueryRow(e.ctx, `SELECT created FROM notifier_create(user_id => 'u1', event_key => 'short',
		body => 'b', ttl => interval '1 millisecond', max_attempts => 1)`).Scan(&created))
	is.True(created)
}

// TestCreateChannels: a submission that names channels gets tasks only on those the user has enabled,
// and its answer names the ones without an enabled preference; the same through Create (own
// transaction) and CreateTx (the caller's), and through a batch with and without names.
func TestCreateChannels(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	_, err := e.n.SetPreference(e.ctx, "u1", "email", "u1@email", false) // present but disabled
	if err != nil {
		t.Fatal(err)
	}
	creator := secRolePool(t, e, "notifier_creator")
	paths := map[string]func(reqs []service.CreateRequest) ([]service.Created, error){
		"CreateBatch": func(reqs []service.CreateRequest) ([]service.Created, error) {
			return service.NewNotifier(creator).CreateBatch(e.ctx, reqs)
		},
		"CreateBatchTx": func(reqs []service.CreateRequest) (out []service.Created, err error) {
			err = pgx.BeginFunc(e.ctx, creator, func(tx pgx.Tx) error {
				out, err = service.NewNotifier(creator).CreateBatchTx(e.ctx, tx, reqs)
				return err
			})
			return out, err
		},
	}
	for name, create := range paths {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			req := func(key string, channels ...string) service.CreateRequest {
				r := ctxReq("u1", name+"-"+key)
				r.Channels = channels
				return r
			}
			out, err := create([]service.CreateRequest{
				req("sms-only", "sms"),
				req("sms-email-fax", "sms", "email", "fax"),
				req("every"),
				req("sms-only", "push"), // a duplicate naming another channel
			})
			is.NoErr(err)
			channels := func(c service.Created) string {
				var names []string
				for _, t := range c.Tasks {
					names = append(names, t.Channel)
				}
				return strings.Join(names, ",")
			}
			is.True(out[0].Created)
			is.Equal(channels(out[0]), "sms")                                    // only the named channel
			is.Equal(len(out[0].ChannelsWithoutPreference), 0)                   // every named one had a preference
			is.Equal(channels(out[1]), "sms")                                    // the named ones the user enabled
			is.Equal(out[1].ChannelsWithoutPreference, []string{"email", "fax"}) // disabled, absent
			is.Equal(channels(out[2]), "push,sms")                               // no names: every enabled channel
			is.Equal(len(out[2].ChannelsWithoutPreference), 0)                   // nothing to name
			is.True(!out[3].Created)                                             // the duplicate
			is.Equal(channels(out[3]), "sms")                                    // gets the first submission's tasks
			is.Equal(out[3].ChannelsWithoutPreference, []string{"push"})         // which have none on push
			is.Equal(e.scalar(`SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
				WHERE n.event_key LIKE $1`, name+"-%"), int64(4)) // sms, sms, push and sms
		})
	}
	is := is.New(t)
	_, err = e.n.CreateBatch(e.ctx, []service.CreateRequest{{UserID: "u1", EventKey: "bad", Body: "b", TTL: time.Hour, MaxAttempts: 3, Channels: []string{"push", "Push!"}}})
	is.True(errors.Is(err, delivery.ErrInvalidInput))  // a bad channel name
	is.True(strings.Contains(err.Error(), "channels")) // names the field
	is.Equal(e.scalar(`SELECT count(*) FROM notification WHERE event_key = 'bad'`), int64(0))
}

// TestCreateBatchTxManyKeys: a batch in the caller's transaction, duplicates within it, answers in the
// order of the requests.
func TestCreateBatchTxManyKeys(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	e.w.User("u2", "sms")
	var reqs []service.CreateRequest
	for i := range 20 {
		reqs = append(reqs, ctxReq([]string{"u2", "u1"}[i%2], fmt.Sprintf("k%d", (20-i)%7)))
	}
	var out []service.Created
	is.NoErr(pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		out, err = e.n.CreateBatchTx(context.Background(), tx, reqs)
		return err
	}))
	seen := map[string]int64{}
	for i, r := range reqs {
		k := r.UserID + "/" + r.EventKey
		id, dup := seen[k]
		is.Equal(out[i].Created, !dup) // the first of each key creates
		if dup {
			is.Equal(out[i].NotificationID, id) // the others get it
		}
		seen[k] = out[i].NotificationID
		is.Equal(len(out[i].Tasks), 1)
		is.Equal(out[i].Tasks[0].Channel, map[string]string{"u1": "push", "u2": "sms"}[r.UserID]) // the user's own
	}
	is.Equal(e.scalar(`SELECT count(*) FROM notification`), int64(len(seen)))
}
