package service_test

// docs/protocol.md#known-boundaries: the seed's claim walked finished rows, so its cost grew with history. The claim queries
// of this project must read only waiting (or leased) tasks, through their partial indexes, however many
// finished tasks the table holds. This test runs the exact SQL of queries/delivery_task.sql under
// EXPLAIN ANALYZE against 100,000 finished tasks.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
)

const claimHistoryTasks = 100_000

func TestClaimIgnoresHistory(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push", "sms")

	// History: one notification and one finished task per row, in a single statement each. Every fourth
	// task is parked (UNKNOWN, needs_review): parked tasks are history for the claim too.
	_, err := e.pool.Exec(ctx, `
		INSERT INTO notification (user_id, event_key, body, expires_at)
		SELECT 'u1', 'hist-' || g, 'body ' || g, now() + interval '1 day'
		FROM generate_series(1, $1::int) AS g`, claimHistoryTasks)
	is.NoErr(err) // history notifications inserted
	_, err = e.pool.Exec(ctx, `
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                           outcome_uncertain, uncertain_since, needs_review, provider_msg_id)
		SELECT n.id,
		       CASE WHEN n.id % 2 = 0 THEN 'push' ELSE 'sms' END,
		       (ARRAY['SENT', 'FAILED', 'SUPPRESSED', 'UNKNOWN'])[n.id % 4 + 1],
		       1, 3, NULL,
		       n.id % 4 = 3,
		       CASE WHEN n.id % 4 = 3 THEN now() END,
		       n.id % 4 = 3,
		       CASE WHEN n.id % 4 = 0 THEN 'msg-' || n.id END
		FROM notification n
		WHERE n.event_key LIKE 'hist-%'`)
	is.NoErr(err)                                                                                                                           // history tasks inserted
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE next_attempt_at IS NULL AND state <> 'SENDING'`), int64(claimHistoryTasks)) // 100,000 finished or parked tasks
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE needs_review`), int64(claimHistoryTasks/4))                                 // a quarter of them parked

	// The live part: a handful of due tasks, some not yet due, some held under a live lease and a handful
	// whose lease expired.
	_, err = e.pool.Exec(ctx, `
		INSERT INTO notification (user_id, event_key, body, expires_at)
		SELECT 'u1', 'live-' || g, 'body ' || g, now() + interval '1 day'
		FROM generate_series(1, 20) AS g`)
	is.NoErr(err) // live notifications inserted
	_, err = e.pool.Exec(ctx, `
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                           attempt_token, lease_owner, lease_until, outcome_uncertain, uncertain_since)
		SELECT n.id, 'push', s.state, s.attempts, 3, s.next_at, s.token, s.owner, s.lease, s.state = 'UNKNOWN',
		       CASE WHEN s.state = 'UNKNOWN' THEN now() END
		FROM (SELECT id, row_number() OVER (ORDER BY id) AS k FROM notification WHERE event_key LIKE 'live-%') n
		CROSS JOIN LATERAL (
		    SELECT CASE WHEN n.k <= 5 THEN 'PENDING' WHEN n.k <= 8 THEN 'UNKNOWN' WHEN n.k <= 12 THEN 'PENDING'
		                ELSE 'SENDING' END AS state,
		           CASE WHEN n.k <= 8 THEN 0 ELSE 1 END AS attempts,
		           CASE WHEN n.k <= 8 THEN now() - make_interval(secs => n.k)
		                WHEN n.k <= 12 THEN now() + interval '1 hour' END AS next_at,
		           CASE WHEN n.k > 12 THEN gen_random_uuid() END AS token,
		           CASE WHEN n.k > 12 THEN 'w-old' END AS owner,
		           CASE WHEN n.k > 16 THEN now() - make_interval(secs => n.k)
		                WHEN n.k > 12 THEN now() + interval '1 hour' END AS lease
		) s`)
	is.NoErr(err)                                                                                                      // live tasks inserted
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE next_attempt_at <= now()`), int64(8))                  // 8 due
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENDING' AND lease_until < now()`), int64(4)) // 4 with an expired lease
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task`), int64(claimHistoryTasks+20))                              // history dwarfs the live tasks
	_, err = e.pool.Exec(ctx, `ANALYZE`)
	is.NoErr(err) // statistics are current

	claims := []struct {
		query   string
		indexes []string
	}{
		{"TaskClaim", []string{"delivery_task_leased_idx", "delivery_task_ready_idx"}},
	}
	for _, c := range claims {
		t.Run(c.query, func(t *testing.T) {
			is := is.New(t)
			sql, args := claimNamedQuery(t, filepath.Join("..", "queries", "delivery_task.sql"), c.query, claimArgs)
			is.True(strings.Contains(sql, "FOR UPDATE OF t SKIP LOCKED")) // the production claim, with its lock

			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)                                            // a transaction to hold the locks
			defer func() { _ = tx.Rollback(context.Background()) }() // EXPLAIN ANALYZE ran the query: release what it locked
			p := explainClaim(t, tx, sql, args)

			ok := true
			check := func(cond bool, what string) {
				if !cond {
					ok = false
					t.Errorf("%s: %s", c.query, what)
				}
			}
			check(p.rootRows >= 1, "the claim finds no task: the plan did not run over the live rows")
			for _, rel := range p.seqScans {
				check(rel != "delivery_task", "Seq Scan on delivery_task")
				check(rel != "notification", "Seq Scan on notification: the join walks history")
			}
			for _, index := range c.indexes {
				check(p.indexes[index], "partial index "+index+" not used")
			}
			check(p.taskRows < 100, "delivery_task rows read >= 100 with 100,000 finished rows")
			check(p.taskBuffers < 100, "delivery_task buffers >= 100 with 100,000 finished rows")
			if !ok {
				t.Logf("SQL:\n%s\nplan:\n%s", sql, p.json)
			}
			is.True(ok) // the claim's cost does not grow with history (details above)
			t.Logf("%s: %v rows and %v buffers read from delivery_task", c.query, p.taskRows, p.taskBuffers)
		})
	}

	// Negative control: without the partial indexes the same queries walk the history, and the checks
	// above would see it. Proves the test can fail.
	t.Run("without partial indexes", func(t *testing.T) {
		is := is.New(t)
		tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		is.NoErr(err)                                            // the indexes are dropped only inside this transaction
		defer func() { _ = tx.Rollback(context.Background()) }() // and come back with the rollback
		_, err = tx.Exec(ctx, `DROP INDEX delivery_task_ready_idx, delivery_task_leased_idx`)
		is.NoErr(err) // drop the claim indexes
		for _, c := range claims {
			sql, args := claimNamedQuery(t, filepath.Join("..", "queries", "delivery_task.sql"), c.query, claimArgs)
			p := explainClaim(t, tx, sql, args)
			if p.taskRows < 1000 {
				t.Logf("SQL:\n%s\nplan:\n%s", sql, p.json)
			}
			is.True(p.rootRows >= 1)    // the claim still finds a task
			is.True(p.taskRows >= 1000) // but reads the history to do it (so the check above can fail)
			for _, index := range c.indexes {
				is.True(!p.indexes[index]) // the index is really gone
			}
		}
	})
}

// A worker's claim walks only its own channel's part of the claim indexes: another channel's backlog
// costs it nothing. Before the indexes led with the channel, a worker for push walked every due row of
// sms ahead of its own in next_attempt_at order and filtered them out (the issue measured 6,000 rows,
// 3.2 ms and 5,972 buffers on every poll of an email worker).
func TestClaimIgnoresOtherChannels(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push", "sms")
	_, err := e.pool.Exec(ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'sms-backlog-' || g, 'body', now() + interval '1 day' FROM generate_series(1, 6000) AS g
			RETURNING id
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT n.id, 'sms', 3, now() - interval '1 hour' FROM n`)
	is.NoErr(err) // 6,000 sms tasks due for an hour: ahead of any push task in next_attempt_at order
	for i := range 5 {
		e.create("u1", fmt.Sprintf("push-%d", i), time.Hour, 3) // and a push and an sms task each
	}
	_, err = e.pool.Exec(ctx, `ANALYZE`)
	is.NoErr(err)
	sql, args := claimNamedQuery(t, filepath.Join("..", "queries", "delivery_task.sql"), "TaskClaim", claimArgs)

	for _, c := range []struct {
		name    string
		setup   string // run inside the transaction before the claim
		perChan bool
	}{
		{"TaskClaim", "", true},
		{"negative control: index not led by the channel", `DROP INDEX delivery_task_ready_idx;
			CREATE INDEX delivery_task_ready_idx ON delivery_task (next_attempt_at, id) WHERE next_attempt_at IS NOT NULL`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }() // the claim and any index change go with it
			if c.setup != "" {
				_, err = tx.Exec(ctx, c.setup)
				is.NoErr(err)
			}
			// As a worker runs it: prepared, on a generic plan, which cannot see which channel is asked for.
			is.Equal(args, []any{"push", int64(10)}) // $1 the channel, $2 the limit
			p := explainGeneric(t, tx, sql, "'push', 10")
			is.True(p.rootRows >= 1) // the push claim finds its tasks
			t.Logf("%s: %v rows and %v buffers read from delivery_task", c.name, p.taskRows, p.taskBuffers)
			if (p.taskRows < 100) != c.perChan {
				t.Logf("plan:\n%s", p.json)
			}
			is.Equal(p.taskRows < 100, c.perChan) // the sms backlog is not read (or, in the control, it is)
		})
	}
}

// scheduledTasks is how many tasks wait for their send time in TestClaimPlanSkipsScheduledTasks:
// 100,000 in just test, a million in just test-long (-scheduled.tasks 1000000), where seeding them
// takes half a minute.
var scheduledTasks = flag.Int("scheduled.tasks", 100_000, "tasks scheduled ahead in TestClaimPlanSkipsScheduledTasks")

// A million tasks (100,000 in just test) scheduled for later (create --send-at, schema/005) sit in delivery_task_ready_idx
// like any waiting task, on the claim's own channel and ahead of nothing: ordered by next_attempt_at,
// they come after every due task, and the claim's range (next_attempt_at <= now()) stops before them.
// The claim reads the few due tasks only, on the plan a worker runs (prepared, generic) and on a custom
// one; the control, an index that keeps the scheduled tasks but not their order, reads them all.
func TestClaimPlanSkipsScheduledTasks(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push")
	start := time.Now()
	// The rows are what the protocol's own inserts make; their per-row triggers (the state machine's
	// checks, the ref) would only slow the seeding: session_replication_role = replica skips them, for
	// this statement's transaction only.
	tx, err := e.pool.Begin(ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(ctx) }() // after the commit, a no-op
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	is.NoErr(err)
	_, err = tx.Exec(ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
			SELECT 'u1', 'later-' || g, 'body', now() + interval '3 days', now() + make_interval(secs => 3600 + g % 86400)
			FROM generate_series(1, $1::int) AS g
			RETURNING id, send_at
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT n.id, 'push', 3, n.send_at FROM n`, *scheduledTasks)
	is.NoErr(err) // a million push tasks, due in an hour to a day
	is.NoErr(tx.Commit(ctx))
	for i := range 5 {
		e.create("u1", fmt.Sprintf("now-%d", i), time.Hour, 3) // and a few due now
	}
	_, err = e.pool.Exec(ctx, `ANALYZE`)
	is.NoErr(err)
	t.Logf("seeded %d scheduled tasks in %s", *scheduledTasks, time.Since(start).Round(time.Millisecond))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE next_attempt_at > now()`), int64(*scheduledTasks))
	start = time.Now()
	st, err := e.n.Status(ctx)
	is.NoErr(err)
	is.Equal(st.Scheduled, int64(*scheduledTasks)) // status counts them apart
	t.Logf("status with %d scheduled tasks: %s", *scheduledTasks, time.Since(start).Round(time.Millisecond))
	sql, args := claimNamedQuery(t, filepath.Join("..", "queries", "delivery_task.sql"), "TaskClaim", claimArgs)
	is.Equal(args, []any{"push", int64(10)}) // $1 the channel, $2 the limit

	for _, c := range []struct {
		name    string
		setup   string // run inside the transaction before the claim
		generic bool
		cheap   bool
	}{
		{"generic plan", "", true, true},
		{"custom plan", "", false, true},
		{"negative control: index without next_attempt_at's order", `DROP INDEX delivery_task_ready_idx;
			CREATE INDEX delivery_task_ready_idx ON delivery_task (channel, id) WHERE next_attempt_at IS NOT NULL`, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }() // the claim's locks and any index change go with it
			if c.setup != "" {
				_, err = tx.Exec(ctx, c.setup)
				is.NoErr(err)
			}
			var p claimPlan
			if c.generic {
				p = explainGeneric(t, tx, sql, "'push', 10")
			} else {
				p = explainClaim(t, tx, sql, args)
			}
			t.Logf("%s: %v rows and %v buffers read from delivery_task", c.name, p.taskRows, p.taskBuffers)
			cheap := p.taskRows < 100 && p.taskBuffers < 100
			if cheap != c.cheap {
				t.Logf("plan:\n%s", p.json)
			}
			is.Equal(p.rootRows, float64(5)) // the five due tasks, no scheduled one
			if c.cheap {
				is.True(!slices.Contains(p.seqScans, "delivery_task")) // no Seq Scan on delivery_task
			}
			is.Equal(cheap, c.cheap) // the scheduled tasks are not read (or, in the control, they are)
		})
	}
}

// claimPlan is what TestClaimIgnoresHistory reads from one EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type claimPlan struct {
	json        string             // the whole plan, indented, for the log
	rootRows    float64            // rows the query returned
	seqScans    []string           // relations read by a Seq Scan
	indexes     map[string]bool    // indexes used
	taskRows    float64            // rows read from delivery_task (returned + removed by filter), all loops
	taskBuffers float64            // shared buffers hit or read by delivery_task scans
	rows        map[string]float64 // rows read per relation (returned + removed by filter), all loops
}

// explain runs the query under EXPLAIN ANALYZE in tx (it really runs: the caller rolls back).
func explainClaim(t *testing.T, tx pgx.Tx, sql string, args []any) claimPlan {
	t.Helper()
	var raw []byte
	if err := tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v\n%s", err, sql)
	}
	var plans []struct {
		Plan claimPlanNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: want one JSON plan, got %d (%v):\n%s", len(plans), err, raw)
	}
	root := plans[0].Plan
	p := claimPlan{json: claimIndentJSON(raw), rootRows: root.ActualRows, indexes: map[string]bool{}, rows: map[string]float64{}}
	root.walk(func(n *claimPlanNode) {
		if n.RelationName != "" && strings.Contains(n.NodeType, "Scan") {
			p.rows[n.RelationName] += (n.ActualRows + n.RowsRemovedByFilter + n.RowsRemovedByIndexRecheck) * max(n.ActualLoops, 1)
		}
		if n.NodeType == "Seq Scan" {
			p.seqScans = append(p.seqScans, n.RelationName)
		}
		if n.IndexName != "" {
			p.indexes[n.IndexName] = true
		}
		onTask := n.RelationName == "delivery_task" || strings.HasPrefix(n.IndexName, "delivery_task_")
		if onTask && strings.Contains(n.NodeType, "Scan") {
			loops := max(n.ActualLoops, 1)
			p.taskRows += (n.ActualRows + n.RowsRemovedByFilter + n.RowsRemovedByIndexRecheck) * loops
			p.taskBuffers += n.SharedHitBlocks + n.SharedReadBlocks
		}
	})
	return p
}

// explainGeneric explains TaskClaim's SQL ($1 the channel, $2 the limit) as a worker runs it: prepared
// (as pgx prepares every statement) and on the generic plan its connections are set to
// (plan_cache_mode = force_generic_plan), executed with args.
func explainGeneric(t *testing.T, tx pgx.Tx, sql, args string) claimPlan {
	t.Helper()
	return explainGenericAs(t, tx, "text, int", sql, args)
}

// explainGenericAs is explainGeneric for a statement whose parameters have the given types; args are
// SQL literals (EXECUTE takes no bound parameters: sqlArray writes an array).
func explainGenericAs(t *testing.T, tx pgx.Tx, types, sql, args string) claimPlan {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{`SET LOCAL plan_cache_mode = force_generic_plan`, `PREPARE generic_plan (` + types + `) AS ` + sql} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	defer func() { _, _ = tx.Exec(ctx, `DEALLOCATE generic_plan`) }()
	return explainClaim(t, tx, `EXECUTE generic_plan(`+args+`)`, nil)
}

// sqlArray writes items as an array literal for explainGenericAs.
func sqlArray(items []string) string { return "'{" + strings.Join(items, ",") + "}'" }

// drainQueueStatistics gives delivery_task the statistics of a drained queue: 20,000 finished tasks of
// u1's push channel (written directly: the fixture, not the protocol), analyzed, so that the planner
// reckons nothing due and nothing leased. What a test adds afterwards the statistics do not know of.
func drainQueueStatistics(t *testing.T, e *env) {
	t.Helper()
	is := is.New(t)
	_, err := e.pool.Exec(e.ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'done-' || g, 'body', now() + interval '1 day' FROM generate_series(1, 20000) AS g
			RETURNING id
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, state, next_attempt_at)
		SELECT n.id, 'push', 3, 'SENT', NULL FROM n`)
	is.NoErr(err) // finished history
	_, err = e.pool.Exec(e.ctx, `ANALYZE delivery_task`)
	is.NoErr(err) // statistics: nothing due, nothing leased
}

// claimPlanNode is the part of an EXPLAIN (FORMAT JSON) node this test reads.
type claimPlanNode struct {
	NodeType                  string          `json:"Node Type"`
	RelationName              string          `json:"Relation Name"`
	IndexName                 string          `json:"Index Name"`
	ActualRows                float64         `json:"Actual Rows"`
	ActualLoops               float64         `json:"Actual Loops"`
	RowsRemovedByFilter       float64         `json:"Rows Removed by Filter"`
	RowsRemovedByIndexRecheck float64         `json:"Rows Removed by Index Recheck"`
	SharedHitBlocks           float64         `json:"Shared Hit Blocks"`
	SharedReadBlocks          float64         `json:"Shared Read Blocks"`
	Plans                     []claimPlanNode `json:"Plans"`
}

func (n *claimPlanNode) walk(fn func(*claimPlanNode)) {
	fn(n)
	for i := range n.Plans {
		n.Plans[i].walk(fn)
	}
}

// claimArgs are the values bound to the claim queries' sqlc parameters, by name.
var claimArgs = map[string]any{
	"channel":   "push",
	"max_tasks": int64(10), // a batch claim (when the query takes one) still reads only due rows
}

var claimSQLCParam = regexp.MustCompile(`@([a-z_][a-z0-9_]*)`)

// claimNamedQuery returns the SQL of the sqlc query `-- name: <name> :...` in file, with its comment lines
// removed and its trailing semicolon dropped, and its sqlc parameters (@channel::text, ...) replaced by
// $1, $2, ... in order of first use (casts kept), with the values from args to bind to them.
func claimNamedQuery(t *testing.T, file, name string, args map[string]any) (string, []any) {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "-- name: "+name+" :")
	if start < 0 {
		t.Fatalf("%s: no query %s", file, name)
	}
	text = text[start:]
	text = text[strings.Index(text, "\n")+1:]
	if end := strings.Index(text, "-- name:"); end >= 0 {
		text = text[:end]
	}
	var lines []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			lines = append(lines, line)
		}
	}
	sql := strings.TrimSpace(strings.Join(lines, "\n"))
	sql = strings.TrimSuffix(sql, ";")
	if !strings.Contains(sql, "@channel") {
		t.Fatalf("%s: no @channel or @channels parameter:\n%s", name, sql)
	}
	position := map[string]int{}
	var values []any
	sql = claimSQLCParam.ReplaceAllStringFunc(sql, func(m string) string {
		param := m[1:]
		if _, seen := position[param]; !seen {
			v, ok := args[param]
			if !ok {
				t.Fatalf("%s: no value for parameter @%s", name, param)
			}
			values = append(values, v)
			position[param] = len(values)
		}
		return "$" + strconv.Itoa(position[param])
	})
	if strings.Contains(sql, "sqlc.") || strings.Contains(sql, ";") {
		t.Fatalf("%s: unexpected sqlc macro or second statement left:\n%s", name, sql)
	}
	return sql, values
}

func claimIndentJSON(raw []byte) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(raw)
	}
	return string(out)
}

// TaskClaim takes expired leases first, then due tasks, and locks no more rows than it returns: its
// branches are CTEs scanned lazily under one LIMIT. Another claimer must still be able to take every
// task this claim did not return.
func TestClaimLocksOnlyWhatItReturns(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	for i := range 10 {
		e.create("u1", fmt.Sprintf("e%d", i), time.Hour, 3)
	}
	holder := e.dispatcher(dcfg{worker: "w-lost", lease: 300 * time.Millisecond})
	for range 2 {
		a, _, err := claimOne(e.ctx, holder)
		is.NoErr(err)
		is.True(a != nil) // a holder that will never finish
	}
	e.waitDB("count(*) = 2 FROM delivery_task WHERE state = 'SENDING' AND lease_until < now()")

	tx, err := e.pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := dbgen.New(tx).TaskClaim(e.ctx, dbgen.TaskClaimParams{Channel: "push", MaxTasks: 3})
	is.NoErr(err)
	is.Equal(len(rows), 3)        // as many as asked
	is.True(rows[0].LeaseExpired) // the expired leases first
	is.True(rows[1].LeaseExpired)
	is.True(!rows[2].LeaseExpired) // then a due task

	var lockable int
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT count(*) FROM (SELECT id FROM delivery_task FOR UPDATE SKIP LOCKED) l`).Scan(&lockable))
	is.Equal(lockable, 7) // the 3 returned are locked, none of the other 7
}

// A worker runs TaskClaim as a prepared statement, and after five executions PostgreSQL settles on a
// generic plan, which cannot see @max_tasks: it guesses 10% of the due backlog. With a backlog large next
// to the notification table, a plain join made that plan hash the locked rows and scan all of
// notification on every claim (found by `notifier bench`: the server's CPU per delivery grew with the
// table). The claim must look notifications and preferences up by key in its generic plan too.
func TestClaimGenericPlanLooksUpByKey(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push", "sms")
	_, err := e.pool.Exec(ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'backlog-' || g, 'body ' || g, now() + interval '1 day'
			FROM generate_series(1, 5000) AS g
			RETURNING id
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT n.id, c.channel, 3, now() FROM n CROSS JOIN (VALUES ('push'), ('sms')) AS c (channel)`)
	is.NoErr(err) // a backlog of 10,000 due tasks on 5,000 notifications
	_, err = e.pool.Exec(ctx, `
		INSERT INTO channel_pref (user_id, channel, address, enabled)
		SELECT 'other-' || g, c.channel, 'other-' || g, true
		FROM generate_series(1, 5000) AS g CROSS JOIN (VALUES ('push'), ('sms')) AS c (channel)`)
	is.NoErr(err) // other users' preferences: scanning them would cost
	_, err = e.pool.Exec(ctx, `ANALYZE`)
	is.NoErr(err) // statistics see the backlog

	// The unsafe variant, as TaskClaim was before: plain joins. Built from the production SQL so that
	// only the join differs.
	lateral := regexp.MustCompile(`(?s)CROSS JOIN LATERAL \(.*\) p ON true`)
	is.True(lateral.MatchString(dbgen.TaskClaim)) // TaskClaim joins through LATERAL subqueries
	plainJoins := lateral.ReplaceAllString(dbgen.TaskClaim,
		"JOIN notification n ON n.id = t.notification_id\nLEFT JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = t.channel")

	for _, c := range []struct {
		name    string
		sql     string
		byIndex bool
	}{
		{"TaskClaim", dbgen.TaskClaim, true},
		{"negative control: plain joins", plainJoins, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			p := explainGeneric(t, tx, c.sql, "'push', 1")
			is.Equal(p.rootRows, float64(1)) // one task claimed
			scansNotification := slices.Contains(p.seqScans, "notification")
			if scansNotification == c.byIndex {
				t.Logf("plan:\n%s", p.json)
			}
			is.Equal(!scansNotification, c.byIndex)             // notification read by key, not scanned
			is.Equal(p.indexes["notification_pkey"], c.byIndex) // through its primary key
			if c.byIndex {
				is.True(!slices.Contains(p.seqScans, "channel_pref")) // preferences are read by key too
				is.True(p.indexes["delivery_task_ready_idx"])         // and the backlog through its index
			}
		})
	}
}

// TaskStartAttempts starts the tasks a claim locked, by their ids. On the generic plan a worker runs it
// with, the ids are an array of unknown length, so the planner weighs the claim indexes against them:
// with statistics taken while the queue was drained (every task finished: no next_attempt_at, no lease,
// as a quiet period leaves them), it reckons one due task, and a plan that scans every due task and
// compares each with every id wins. Then each claim behind a burst costs backlog x ids comparisons.
// The production SQL finds each task by its key, from the ids, however the statistics read; the
// negative control, the state condition written as plain comparisons (as it was), scans the backlog.
func TestStartAttemptsGenericPlanLooksUpByKey(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push", "sms")
	drainQueueStatistics(t, e)
	// Then a burst: 4,000 due tasks the statistics do not know of.
	_, err := e.pool.Exec(ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'burst-' || g, 'body', now() + interval '1 day' FROM generate_series(1, 4000) AS g
			RETURNING id
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT n.id, 'push', 3, now() FROM n`)
	is.NoErr(err)

	caseForm := regexp.MustCompile(`AND CASE t\.state .* END\n`)
	is.True(caseForm.MatchString(dbgen.TaskStartAttempts)) // the state condition is a CASE
	plainForm := caseForm.ReplaceAllString(dbgen.TaskStartAttempts, `AND ((t.state = 'SENDING' AND t.lease_until < now())
           OR (t.state IN ('PENDING', 'UNKNOWN') AND NOT t.needs_review AND t.next_attempt_at <= now()))
`)
	const claimed = 64
	for _, c := range []struct {
		name  string
		sql   string
		byKey bool
	}{
		{"TaskStartAttempts", dbgen.TaskStartAttempts, true},
		{"negative control: plain comparisons", plainForm, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			var ids []int64
			rows, err := tx.Query(ctx, `SELECT id FROM delivery_task WHERE next_attempt_at IS NOT NULL ORDER BY id LIMIT $1 FOR UPDATE`, claimed)
			is.NoErr(err)
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			is.NoErr(err)
			is.Equal(len(ids), claimed)
			idList, tokens, uncertain, actions := make([]string, claimed), make([]string, claimed), make([]string, claimed), make([]string, claimed)
			for i, id := range ids {
				idList[i], tokens[i] = strconv.FormatInt(id, 10), fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
				uncertain[i], actions[i] = "false", "SEND"
			}
			p := explainGenericAs(t, tx, "text, float8, bigint[], text[], bool[], text[]", c.sql,
				fmt.Sprintf("'w1', 60, %s, %s, %s, %s", sqlArray(idList), sqlArray(tokens), sqlArray(uncertain), sqlArray(actions)))
			is.Equal(p.rootRows, float64(claimed)) // every locked task started
			if (p.rows["delivery_task"] <= claimed) != c.byKey {
				t.Logf("plan:\n%s", p.json)
			}
			t.Logf("%s: %v delivery_task rows read for %d tasks", c.name, p.rows["delivery_task"], claimed)
			is.Equal(p.rows["delivery_task"] <= claimed, c.byKey) // each task read once, by key (the control reads the burst)
			is.Equal(p.indexes["delivery_task_pkey"], c.byKey)
		})
	}
}

// TaskStartAttempts starts only a task a claim may take, whatever ids it is given: due and waiting, or
// SENDING with a lease run out on the database clock. Its state condition repeats the claim's, so no
// other row is started even by a caller that passes the wrong ids.
func TestStartAttemptsStartsOnlyClaimableTasks(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push")
	// One task per case, written directly (the fixture, not the protocol).
	cases := []struct {
		name      string
		columns   string // state and the columns it needs
		uncertain bool   // an UNKNOWN task, and one whose lease ran out, start uncertain (the state machine holds to it)
		starts    bool
	}{
		{"pending, due", `'PENDING', false, now(), NULL, NULL, NULL, false, NULL, 0`, false, true},
		{"pending, due later", `'PENDING', false, now() + interval '1 hour', NULL, NULL, NULL, false, NULL, 0`, false, false},
		{"unknown, due", `'UNKNOWN', false, now(), NULL, NULL, NULL, true, now(), 1`, true, true},
		{"unknown, parked", `'UNKNOWN', true, NULL, NULL, NULL, NULL, true, now(), 1`, true, false},
		{"sending, lease live", `'SENDING', false, NULL, now() + interval '1 hour', gen_random_uuid(), 'w0', false, NULL, 1`, false, false},
		{"sending, lease run out", `'SENDING', false, NULL, now() - interval '1 second', gen_random_uuid(), 'w0', false, NULL, 1`, true, true},
		{"sent", `'SENT', false, NULL, NULL, NULL, NULL, false, NULL, 1`, false, false},
	}
	ids := make([]int64, len(cases))
	for i, c := range cases {
		err := e.pool.QueryRow(ctx, `
			WITH n AS (
				INSERT INTO notification (user_id, event_key, body, expires_at)
				VALUES ('u1', $1, 'body', now() + interval '1 day') RETURNING id
			)
			INSERT INTO delivery_task (notification_id, channel, max_attempts, state, needs_review, next_attempt_at,
			                           lease_until, attempt_token, lease_owner, outcome_uncertain, uncertain_since, attempt_count)
			SELECT n.id, 'push', 3, `+c.columns+` FROM n
			RETURNING id`, "case-"+strconv.Itoa(i)).Scan(&ids[i])
		is.NoErr(err) // the fixture's row
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.Begin(ctx)
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			started, err := dbgen.New(tx).TaskStartAttempts(ctx, dbgen.TaskStartAttemptsParams{
				Worker: "w1", LeaseSeconds: 60, IDs: []int64{ids[i]},
				AttemptTokens:    []string{"00000000-0000-4000-8000-000000000001"},
				OutcomeUncertain: []bool{c.uncertain},
				Actions:          []string{"SEND"},
			})
			is.NoErr(err)
			is.Equal(len(started) == 1, c.starts) // started exactly when a claim may take it
		})
	}
}

// AttemptMarkLeaseExpired (a takeover closes the lost holder's attempt) and TaskHeldByTokens (a claim
// whose commit's answer was lost finds its tasks) start from tokens and read each task by its key. With
// statistics of a drained queue, a plain comparison of lease_until let their generic plans walk every
// expired (or live) lease and compare each with every token instead: after a crash, when leases expire
// by the thousand. The production SQL tests the lease IS TRUE, which no index answers; the negative
// controls, the plain comparisons, walk the leases.
func TestLeaseQueriesGenericPlansLookUpByKey(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push")
	drainQueueStatistics(t, e)
	// Then 4,000 held tasks the statistics do not know of, half of their leases run out, each with its
	// open attempt (the fixture, not the protocol).
	_, err := e.pool.Exec(ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'held-' || g, 'body', now() + interval '1 day' FROM generate_series(1, 4000) AS g
			RETURNING id, event_key
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, state, next_attempt_at, lease_until,
		                           attempt_token, lease_owner, attempt_count)
		SELECT n.id, 'push', 3, 'SENDING', NULL,
		       CASE WHEN substr(n.event_key, 6)::int % 2 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
		       gen_random_uuid(), 'w0', 1
		FROM n`)
	is.NoErr(err)
	_, err = e.pool.Exec(ctx, `
		INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		SELECT id, 1, attempt_token, 'SEND', 'w0' FROM delivery_task WHERE state = 'SENDING'`)
	is.NoErr(err)
	tokens := func(leaseRanOut bool) string {
		var list []string
		err := e.pool.QueryRow(ctx, `
			SELECT array_agg(attempt_token::text ORDER BY id) FROM (
				SELECT id, attempt_token FROM delivery_task
				WHERE state = 'SENDING' AND (lease_until < now()) = $1 ORDER BY id LIMIT 64) x`, leaseRanOut).Scan(&list)
		is.NoErr(err)
		is.Equal(len(list), 64)
		return sqlArray(list)
	}
	plain := strings.NewReplacer("(t.lease_until < now()) IS TRUE", "t.lease_until < now()",
		"(t.lease_until > now()) IS TRUE", "t.lease_until > now()")
	for _, c := range []struct {
		name   string
		sql    string
		tokens string
		byKey  bool
	}{
		{"AttemptMarkLeaseExpired", dbgen.AttemptMarkLeaseExpired, tokens(true), true},
		{"negative control: AttemptMarkLeaseExpired, plain comparison", plain.Replace(dbgen.AttemptMarkLeaseExpired), tokens(true), false},
		{"TaskHeldByTokens", dbgen.TaskHeldByTokens, tokens(false), true},
		{"negative control: TaskHeldByTokens, plain comparison", plain.Replace(dbgen.TaskHeldByTokens), tokens(false), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(c.byKey, c.sql == dbgen.AttemptMarkLeaseExpired || c.sql == dbgen.TaskHeldByTokens) // a control is not the production SQL
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			p := explainGenericAs(t, tx, "text[]", c.sql, c.tokens)
			if (p.rows["delivery_task"] <= 64) != c.byKey {
				t.Logf("plan:\n%s", p.json)
			}
			t.Logf("%s: %v delivery_task rows read for 64 tokens", c.name, p.rows["delivery_task"])
			is.Equal(p.rows["delivery_task"] <= 64, c.byKey) // each task read once, by key (the control walks the leases)
		})
	}
}

// The lease conditions of the two token-keyed queries, on their own: a takeover closes only the attempt
// of a holder whose lease ran out (a live holder's attempt stays open for its finish), and a claimer
// that lost its commit's answer finds only tasks it still holds under a live lease.
func TestLeaseQueriesHonourTheLease(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	is := is.New(t)
	e.w.User("u1", "push")
	token := map[bool]string{} // by whether the lease ran out
	for _, ranOut := range []bool{false, true} {
		lease := "now() + interval '1 hour'"
		if ranOut {
			lease = "now() - interval '1 second'"
		}
		var tok string
		err := e.pool.QueryRow(ctx, `
			WITH n AS (
				INSERT INTO notification (user_id, event_key, body, expires_at)
				VALUES ('u1', $1, 'body', now() + interval '1 day') RETURNING id
			), t AS (
				INSERT INTO delivery_task (notification_id, channel, max_attempts, state, next_attempt_at, lease_until,
				                           attempt_token, lease_owner, attempt_count)
				SELECT n.id, 'push', 3, 'SENDING', NULL, `+lease+`, gen_random_uuid(), 'w0', 1 FROM n
				RETURNING id, attempt_token
			)
			INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
			SELECT id, 1, attempt_token, 'SEND', 'w0' FROM t
			RETURNING attempt_token::text`, fmt.Sprint("held-", ranOut)).Scan(&tok)
		is.NoErr(err) // the fixture: a held task and its open attempt
		token[ranOut] = tok
	}
	q := dbgen.New(e.pool)

	held, err := q.TaskHeldByTokens(ctx, []string{token[false], token[true]})
	is.NoErr(err)
	is.Equal(len(held), 1)                       // only the task still held under a live lease
	is.Equal(held[0].AttemptToken, token[false]) // is found by its token

	for _, ranOut := range []bool{false, true} {
		t.Run(fmt.Sprint("lease ran out: ", ranOut), func(t *testing.T) {
			is := is.New(t)
			tx, err := e.pool.Begin(ctx)
			is.NoErr(err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			closed, err := dbgen.New(tx).AttemptMarkLeaseExpired(ctx, []string{token[ranOut]})
			is.NoErr(err)
			is.Equal(closed == 1, ranOut) // closed exactly when the holder's lease ran out
		})
	}
}
