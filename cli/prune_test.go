package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"
)

// pruneHistory fills a database with (test-only SQL): 5 old notifications with two SENT tasks and one
// attempt each, one old notification whose tasks are a FAILED one and a parked UNKNOWN one, one old
// PENDING task, and one notification without tasks. The finished tasks are made as workers would have
// made them two days ago (the state machine of schema/003 accepts no other history): claimed with an
// open attempt, the attempt's outcome, the finish.
func pruneHistory(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{
		`INSERT INTO notification (user_id, event_key, body, created_at, expires_at)
		 SELECT 'u1', 'old-' || g, 'b', now() - interval '3 days', now() + interval '1 day' FROM generate_series(1, 8) AS g`,
		`INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                            attempt_token, lease_owner, lease_until, updated_at)
		 SELECT n.id, c, 'SENDING', 1, 3, NULL, gen_random_uuid(), 'w', now() + interval '1 hour', now() - interval '2 days'
		 FROM notification n
		 CROSS JOIN (VALUES ('push'), ('sms'), ('none')) AS ch (c)
		 WHERE (n.event_key IN ('old-1', 'old-2', 'old-3', 'old-4', 'old-5') AND c <> 'none')
		    OR (n.event_key = 'old-6' AND c <> 'sms')`,
		`INSERT INTO delivery_task (notification_id, channel, max_attempts, updated_at)
		 SELECT n.id, 'push', 3, now() - interval '2 days' FROM notification n WHERE n.event_key = 'old-7'`,
		`INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, started_at)
		 SELECT t.id, 1, t.attempt_token, 'SEND', 'w', t.updated_at FROM delivery_task t WHERE t.state = 'SENDING'`,
		// old-6's push task was rejected, its none task timed out; every other one was accepted
		`UPDATE delivery_attempt a
		 SET outcome = CASE WHEN t.channel = 'none' THEN 'TIMEOUT' WHEN n.event_key = 'old-6' THEN 'REJECTED' ELSE 'ACCEPTED' END,
		     finished_at = a.started_at
		 FROM delivery_task t JOIN notification n ON n.id = t.notification_id
		 WHERE t.id = a.task_id`,
		`UPDATE delivery_task t
		 SET state = CASE a.outcome WHEN 'ACCEPTED' THEN 'SENT' WHEN 'REJECTED' THEN 'FAILED' ELSE 'UNKNOWN' END,
		     needs_review = a.outcome = 'TIMEOUT', outcome_uncertain = a.outcome = 'TIMEOUT',
		     uncertain_since = CASE WHEN a.outcome = 'TIMEOUT' THEN t.updated_at END,
		     lease_owner = NULL, lease_until = NULL
		 FROM delivery_attempt a
		 WHERE a.task_id = t.id AND t.state = 'SENDING'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

type pruneJSON struct {
	Tasks         int64 `json:"tasks"`
	Attempts      int64 `json:"attempts"`
	Receipts      int64 `json:"receipts"`
	Notifications int64 `json:"notifications"`
	Batches       int64 `json:"batches"`
	DryRun        bool  `json:"dry_run"`
}

// TestPrune: prune deletes old finished history in batches and prints what it deleted; --dry-run
// deletes nothing; a second run deletes nothing and still exits 0.
func TestPrune(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	pruneHistory(t, pool)
	before := rowCounts(t, pool)
	is.Equal(before, [4]int64{0, 8, 13, 12}) // 8 notifications, 13 tasks, 12 attempts

	var dry pruneJSON
	decode(t, c.ok("prune", "--older-than", "24h", "--batch", "4", "--dry-run").stdout, &dry)
	is.Equal(dry, pruneJSON{Tasks: 11, Attempts: 11, Notifications: 6, Batches: 3, DryRun: true}) // what would go
	is.Equal(rowCounts(t, pool), before)                                                          // and nothing went

	var got pruneJSON
	r := c.ok("prune", "--older-than", "24h", "--batch", "4")
	decode(t, r.stdout, &got)
	// 10 SENT + 1 FAILED task with their attempts; old-1..5 and the empty old-8. old-6 stays for its
	// parked task, old-7 for its PENDING one.
	is.Equal(got, pruneJSON{Tasks: 11, Attempts: 11, Notifications: 6, Batches: 4})
	is.Equal(rowCounts(t, pool), [4]int64{0, 2, 2, 1}) // the parked task (with its attempt) and the pending one remain
	var unfinished int64
	is.NoErr(pool.QueryRow(context.Background(), `SELECT count(*) FROM delivery_task WHERE state IN ('PENDING', 'UNKNOWN')`).Scan(&unfinished))
	is.Equal(unfinished, int64(2)) // exactly the unfinished ones

	var again pruneJSON
	decode(t, c.ok("prune", "--older-than", "24h").stdout, &again)
	is.Equal(again, pruneJSON{}) // nothing left to delete, still exit 0 (a scheduled job is not failing)

	var recent pruneJSON
	_, err := pool.Exec(context.Background(), `
		WITH s AS (
		    UPDATE delivery_task SET state = 'FAILED', next_attempt_at = NULL, attempt_count = attempt_count + 1, updated_at = now()
		    WHERE state = 'PENDING' RETURNING id, attempt_count)
		INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
		SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w', now(), 'TTL_EXPIRED' FROM s`)
	is.NoErr(err) // the pending task finishes now (expired at its claim)
	decode(t, c.ok("prune", "--older-than", "24h").stdout, &recent)
	is.Equal(recent, pruneJSON{}) // a task that just finished is inside the period
}

// TestPruneBadInput: bad flags exit 2 with one line and delete nothing.
func TestPruneBadInput(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	pruneHistory(t, pool)
	before := rowCounts(t, pool)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing period", []string{"prune"}, "--older-than"},
		{"period too short", []string{"prune", "--older-than", "30m"}, "--older-than 30m"},
		{"period not a duration", []string{"prune", "--older-than", "a month"}, "older-than"},
		{"zero batch", []string{"prune", "--older-than", "24h", "--batch", "0"}, "--batch 0"},
		{"batch too large", []string{"prune", "--older-than", "24h", "--batch", "10001"}, "--batch 10001"},
		{"negative pause", []string{"prune", "--older-than", "24h", "--pause", "-1s"}, "--pause"},
		{"stray argument", []string{"prune", "--older-than", "24h", "now"}, `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", tc.args...)
			is.Equal(r.code, 2)                          // usage or bad input
			oneErrorLine(t, r)                           // one clear line
			is.True(strings.Contains(r.stderr, tc.want)) // naming what is wrong
			is.Equal(r.stdout, "")                       // no result
			is.Equal(rowCounts(t, pool), before)         // nothing deleted
		})
	}
	t.Run("help", func(t *testing.T) {
		is := is.New(t)
		r := c.in(t).run("", "prune", "--help")
		is.Equal(r.code, 0)                                  // help is not an error
		is.True(strings.Contains(r.stdout, "Never deleted")) // says what is never deleted
		is.True(strings.Contains(r.stdout, "PENDING, SENDING or UNKNOWN"))
		is.True(strings.Contains(r.stdout, "dedupe window"))     // and what pruning a notification means
		is.True(strings.Contains(r.stdout, "3 nothing changed")) // documents the exit codes
	})
}
