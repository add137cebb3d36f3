package service_test

// Per-channel rate limits shared by every worker (schema/001_tables.sql,
// queries/channel_rate_limit.sql, docs/operations.md#rate-limits): a token bucket row per channel,
// taken in the claim's transaction, one token per call; a 429 pauses the channel for every worker.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// backlog inserts n due PENDING tasks on channel for user (the channel enabled), in bulk, oldest first
// in key order; it returns nothing: claims find them by age.
func (e *env) backlog(user, channel, prefix string, n int) {
	e.t.Helper()
	e.w.User(user, channel)
	if _, err := e.pool.Exec(e.ctx, `
		WITH n AS (
			INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT $1, $3 || g, 'body ' || g, now() + interval '1 hour' FROM generate_series(1, $4::int) AS g
			RETURNING id
		)
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT id, $2, 3, now() FROM n`, user, channel, prefix, n); err != nil {
		e.t.Fatal(err)
	}
}

// bucketNow is a bucket as it stands on the database clock.
type bucketNow struct {
	rate, burst, tokens float64
	pausedFor           float64 // seconds of pause left
	pause               float64 // seconds the last pause was set for (paused_until - updated_at)
}

func (e *env) bucket(channel string) bucketNow {
	e.t.Helper()
	var b bucketNow
	if err := e.pool.QueryRow(e.ctx, `
		SELECT rate, burst, rate_limit_tokens(tokens, rate, burst, refilled_at, paused_until),
		       coalesce(extract(epoch FROM paused_until - now())::float8, 0),
		       coalesce(extract(epoch FROM paused_until - updated_at)::float8, 0)
		FROM channel_rate_limit WHERE channel = $1`, channel).Scan(&b.rate, &b.burst, &b.tokens, &b.pausedFor, &b.pause); err != nil {
		e.t.Fatalf("bucket %s: %v", channel, err)
	}
	return b
}

// setTokens empties or fills a bucket by hand (as the owner), counted from now.
func (e *env) setTokens(channel string, tokens float64) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, `UPDATE channel_rate_limit SET tokens = $2, refilled_at = now() WHERE channel = $1`,
		channel, tokens); err != nil {
		e.t.Fatal(err)
	}
}

// slow is a rate so low that no token comes during a test: what a bucket holds is what the test put.
const slow = 1.0 / 3600

// A claim calls at most as many of a limited channel's tasks as the bucket has whole tokens, takes one
// per call, leaves the other tasks exactly as they were, and claims nothing more until tokens come
// back; tasks settled at claim time make no call and take no token.
func TestRateLimitTakesOneTokenPerCall(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	// Two tasks whose user turns push off (settled SUPPRESSED at claim, no call), then eight to call.
	e.w.User("u0", "push")
	for i := range 2 {
		e.create("u0", fmt.Sprintf("off-%d", i), time.Hour, 3)
	}
	_, err := e.n.SetPreference(e.ctx, "u0", "push", "u0@push", false)
	is.NoErr(err)
	e.backlog("u1", "push", "call-", 8)
	var held atomic.Int64
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: slow, Burst: 5}},
		onRate: func(ch string) {
			if ch == "push" {
				held.Add(1)
			}
		}})
	is.Equal(e.bucket("push").burst, 5.0)             // the worker wrote its limit
	is.True(e.bucket("push").tokens >= 4.999)         // and a new bucket starts full
	e.setTokens("push", 2)                            // two tokens to begin with
	attempts, settled, err := d.ClaimBatch(e.ctx, 64) // the peek allows 2: the two oldest, both settled
	is.NoErr(err)
	is.Equal(len(attempts), 0)                          // no call
	is.Equal(len(settled), 2)                           // the two tasks of the user who turned push off
	is.Equal(settled[0].Kind, service.ResultSuppressed) // settled without a call
	is.True(e.bucket("push").tokens >= 1.999)           // and without a token

	attempts, _, err = d.ClaimBatch(e.ctx, 64)
	is.NoErr(err)
	is.Equal(len(attempts), 2)               // two tokens: two calls
	is.True(e.bucket("push").tokens < 0.001) // both taken
	is.True(held.Load() >= 1)                // the claim was held back, and said so

	attempts, settled, err = d.ClaimBatch(e.ctx, 64)
	is.NoErr(err)
	is.Equal(len(attempts)+len(settled), 0)                                                                                               // no token: nothing claimed
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'PENDING' AND attempt_count = 0 AND channel = 'push'`), int64(6)) // the rest untouched

	e.setTokens("push", 3.5)
	attempts, _, err = d.ClaimBatch(e.ctx, 64)
	is.NoErr(err)
	is.Equal(len(attempts), 3)               // whole tokens only
	is.True(e.bucket("push").tokens >= 0.49) // the half token stays
	is.True(e.bucket("push").tokens < 0.51)
}

// RateLimited reports a claim that the bucket cut short, and only that: a claim with more tokens than
// room is stopped by its own size, so it reports nothing, whether the limited channel comes first in the
// claim or after another channel's tasks; one whose tokens ran out first does report.
func TestRateLimitReportsOnlyClaimsTheBucketCut(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "t-", 10)
	e.backlog("u2", "sms", "s-", 2)
	var held atomic.Int64
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: slow, Burst: 10}},
		onRate: func(ch string) {
			if ch == "push" {
				held.Add(1)
			}
		}})
	e.setTokens("push", 8)
	// Two claims of 4, one starting with each channel: 4 push tasks, and 2 sms tasks then 2 push.
	for range 2 {
		attempts, _, err := d.ClaimBatch(e.ctx, 4)
		is.NoErr(err)
		is.Equal(len(attempts), 4)
	}
	is.Equal(held.Load(), int64(0)) // the claims' size stopped them, not the bucket

	attempts, _, err := d.ClaimBatch(e.ctx, 6) // room for 6, 2 tokens left
	is.NoErr(err)
	is.Equal(len(attempts), 2)
	is.Equal(held.Load(), int64(1)) // the bucket stopped it
}

// When the peek promised more tokens than the take can grant (another worker took them in between),
// the calls without a token are not made: their tasks stay exactly as they were, due at once, with no
// attempt row, and a claim of the whole batch still commits the rest.
func TestRateLimitCallsOnlyWhatIsGranted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "t-", 6)
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: slow, Burst: 6}}})
	// Another claim holds the bucket while this one peeks (6 tokens) and locks 6 tasks; it takes 4 of
	// them before it commits.
	tx, err := e.pool.Begin(e.ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM channel_rate_limit WHERE channel = 'push' FOR UPDATE`)
	is.NoErr(err) // the other claim's lock
	type claim struct {
		attempts []*service.Attempt
		err      error
	}
	done := make(chan claim, 1)
	go func() {
		a, _, err := d.ClaimBatch(e.ctx, 64)
		done <- claim{a, err}
	}()
	e.waitDB(`EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE NOT l.granted AND a.datname = current_database())`) // this claim waits for the bucket
	_, err = tx.Exec(e.ctx, `UPDATE channel_rate_limit SET tokens = tokens - 4 WHERE channel = 'push'`)
	is.NoErr(err)
	is.NoErr(tx.Commit(e.ctx)) // the other claim took 4 and commits
	c := <-done
	is.NoErr(c.err)
	is.Equal(len(c.attempts), 2) // 6 tasks locked, 2 tokens granted: 2 calls
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'PENDING' AND attempt_count = 0
		AND next_attempt_at <= now()`), int64(4)) // the other 4 untouched, due
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt`), int64(2)) // and without an attempt row
	is.True(e.bucket("push").tokens < 0.001)                              // every token spent once
}

// Many workers claiming at once from two limited channels (each worker starting with a different
// channel, so their claims want the two buckets in opposite orders) never deadlock, and together they
// never start more calls than each bucket held and gained: burst + rate x time (on the database clock,
// from the bucket's creation to its last take) - what is left.
func TestRateLimitSharedAcrossConcurrentClaims(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "p-", 600)
	e.backlog("u1", "sms", "s-", 600)
	limits := map[string]delivery.RateLimit{"push": {PerSecond: 40, Burst: 8}, "sms": {PerSecond: 25, Burst: 5}}
	const workers = 6
	ds := make([]*dispatcher, workers)
	for i := range ds {
		ds[i] = e.dispatcher(dcfg{worker: fmt.Sprintf("w%d", i), lease: time.Hour, rateLimits: limits})
	}
	var created time.Time
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT max(updated_at) FROM channel_rate_limit`).Scan(&created)) // the last configuration

	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if _, _, err := d.ClaimBatch(context.Background(), 7); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		is.NoErr(err) // no claim failed: no deadlock, no constraint
	}
	for ch, limit := range limits {
		var started int64
		var span, left float64
		is.NoErr(e.pool.QueryRow(e.ctx, `
			SELECT (SELECT count(*) FROM delivery_attempt a JOIN delivery_task t ON t.id = a.task_id WHERE t.channel = $1),
			       extract(epoch FROM b.refilled_at - $2::timestamptz)::float8, b.tokens
			FROM channel_rate_limit b WHERE b.channel = $1`, ch, created).Scan(&started, &span, &left))
		most := limit.Burst + limit.PerSecond*span - left
		t.Logf("%s: %d calls started in %.2fs; the bucket allowed %.2f", ch, started, span, most)
		is.True(started > 0)                   // the workers did claim
		is.True(float64(started) <= most+1e-6) // never more than the bucket allowed
	}
}

// A channel whose bucket is empty costs a claim one primary-key probe of channel_rate_limit, however
// many of its tasks are due: TaskClaim is not run for it, so no task row is read or locked.
func TestRateLimitClaimIgnoresThrottledBacklog(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "backlog-", 10_000)
	_, err := e.pool.Exec(e.ctx, `
		INSERT INTO channel_rate_limit (channel, rate, burst, tokens)
		SELECT 'other' || g, 10, 10, 10 FROM generate_series(1, 2000) AS g`)
	is.NoErr(err) // 2,000 other channels' buckets, so that a scan of the table would show
	_, err = e.pool.Exec(e.ctx, `ANALYZE`)
	is.NoErr(err)

	log := &statementLog{}
	cfg, err := pgxpool.ParseConfig(e.workerPool.Config().ConnString())
	is.NoErr(err)
	cfg.ConnConfig.Tracer = log
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	d := tracedDispatcher(t, e, pool, delivery.RateLimit{PerSecond: slow, Burst: 10})

	for _, c := range []struct {
		name    string
		tokens  float64
		claims  bool // TaskClaim runs
		started int
	}{
		{"empty bucket", 0.5, false, 0},
		{"negative control: tokens", 3, true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			e.setTokens("push", c.tokens)
			log.reset()
			attempts, settled, err := d.ClaimBatch(e.ctx, 64)
			is.NoErr(err)
			is.Equal(len(attempts), c.started) // calls as tokens allow
			is.Equal(len(settled), 0)
			names := log.names()
			t.Logf("statements: %v", names)
			is.Equal(names[0], "RateLimitPeek")                  // the claim begins with the peek
			is.Equal(contains(names, "TaskClaim"), c.claims)     // the channel's tasks are looked at only with a token
			is.Equal(contains(names, "RateLimitTake"), c.claims) // and only calls take
		})
	}

	// The peek and the take are primary-key lookups, on the generic plan a worker runs.
	tx, err := e.pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(e.ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	is.NoErr(err)
	for _, q := range []struct{ name, call string }{
		{"RateLimitPeek", `EXECUTE q(ARRAY['push'])`},
		{"RateLimitTake", `EXECUTE q(ARRAY['push'], ARRAY[1])`},
	} {
		sql, _ := claimNamedQuery(t, filepath.Join("..", "queries", "channel_rate_limit.sql"), q.name,
			map[string]any{"channels": []string{"push"}, "calls": []int32{1}})
		_, err = tx.Exec(e.ctx, `PREPARE q AS `+sql)
		is.NoErr(err)
		p := explainClaim(t, tx, q.call, nil)
		_, err = tx.Exec(e.ctx, `DEALLOCATE q`)
		is.NoErr(err)
		t.Logf("%s: %v rows read from channel_rate_limit, indexes %v, seq scans %v", q.name, p.rows["channel_rate_limit"], p.indexes, p.seqScans)
		if !p.indexes["channel_rate_limit_pkey"] || len(p.seqScans) > 0 {
			t.Logf("plan:\n%s", p.json)
		}
		is.True(p.indexes["channel_rate_limit_pkey"]) // by primary key
		is.Equal(len(p.seqScans), 0)                  // no table scanned
		is.Equal(p.rows["channel_rate_limit"], 1.0)   // one bucket read among 2,001
		is.Equal(p.rows["delivery_task"], 0.0)        // and no task
	}
}

// tracedDispatcher is a push dispatcher on pool with the given limit, configured as `work` does.
func tracedDispatcher(t testing.TB, e *env, pool *pgxpool.Pool, limit delivery.RateLimit) *service.Dispatcher {
	t.Helper()
	routes := map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent,
		Client: answering{Outcome: delivery.OutcomeAccepted}, RateLimit: limit}}
	d, err := service.NewDispatcher(t.Context(), pool, service.DispatcherConfig{Worker: "w-traced", Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// statementLog records the name (queries/'s "-- name:") of every statement but BEGIN and COMMIT that
// a pool's connections send, alone or in a batch.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

func (l *statementLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = nil
}

func (l *statementLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for _, sql := range l.sql {
		name := strings.Fields(strings.TrimPrefix(sql, "-- name: "))[0]
		if !strings.HasPrefix(name, "Tx") { // BEGIN and COMMIT
			names = append(names, name)
		}
	}
	return names
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.add(data.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		l.add(q.SQL)
	}
	return ctx
}

func (l *statementLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A 429 with Retry-After on a limited channel pauses it for every worker: the other dispatcher's
// claims get nothing of that channel until the pause has passed on the database clock, and the bucket
// then fills from empty. A channel without a bucket is not paused (negative control): its 429 delays
// only its own task.
func TestRateLimit429PausesEveryWorker(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	first := e.create("u1", "first", time.Hour, 3) // a push and an sms task, oldest
	for i := range 3 {
		e.create("u1", fmt.Sprintf("next-%d", i), time.Hour, 3)
	}
	var pushID, smsID int64
	for _, task := range first {
		if task.Channel == "push" {
			pushID = task.TaskID
		} else {
			smsID = task.TaskID
		}
	}
	e.push.ScriptSend(e.ref(pushID), fakes.Step{Status: 429, RetryAfter: "2"})
	e.sms.ScriptSend(e.ref(smsID), fakes.Step{Status: 429, RetryAfter: "2"})
	type pause struct {
		channel string
		pause   time.Duration
		err     error
	}
	var mu sync.Mutex
	var pauses []pause
	limits := map[string]delivery.RateLimit{"push": {PerSecond: 100, Burst: 100}} // sms: no limit
	a := e.dispatcher(dcfg{worker: "w-a", rateLimits: limits, onPause: func(p service.RatePauseEvent) {
		mu.Lock()
		defer mu.Unlock()
		pauses = append(pauses, pause{p.Channel, p.Pause, p.Err})
	}})
	b := e.dispatcher(dcfg{worker: "w-b", rateLimits: limits})

	// A calls the oldest push and sms tasks (one claim each: a claim starts with the next channel):
	// both answer 429, Retry-After 2.
	var attempts []*service.Attempt
	for range 2 {
		claimed, _, err := a.ClaimBatch(e.ctx, 1)
		is.NoErr(err)
		attempts = append(attempts, claimed...)
	}
	is.Equal(len(attempts), 2)                                           // the first push and sms tasks
	is.True(attempts[0].Channel != attempts[1].Channel)                  // one of each
	is.True(attempts[0].TaskID == pushID || attempts[0].TaskID == smsID) // the oldest
	is.True(attempts[1].TaskID == pushID || attempts[1].TaskID == smsID)
	results, err := a.FinishBatch(e.ctx, attempts, callAll(e.ctx, a, attempts))
	is.NoErr(err)
	for _, r := range results {
		is.Equal(r.Outcome, delivery.OutcomeThrottled) // both throttled
		is.Equal(r.Kind, service.ResultPending)        // refused before acceptance: retried
	}
	is.Equal(pauses, []pause{{"push", 2 * time.Second, nil}})                                                                     // only the limited channel is paused
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE next_attempt_at >= updated_at + interval '2 seconds'`), int64(2)) // each throttled task waits for its Retry-After too
	pushBucket := e.bucket("push")
	is.Equal(pushBucket.pause, 2.0)  // for its Retry-After, on the database clock
	is.Equal(pushBucket.tokens, 0.0) // holding nothing meanwhile

	// B, another worker: nothing of push while the pause lasts; sms (no bucket) goes on at once.
	attempts, _, err = b.ClaimBatch(e.ctx, 10)
	is.NoErr(err)
	is.True(e.bucket("push").pausedFor > 0) // the claim ran inside the pause
	channels := map[string]int{}
	for _, at := range attempts {
		channels[at.Channel]++
	}
	is.Equal(channels["push"], 0) // push paused for B too
	is.Equal(channels["sms"], 3)  // the negative control: sms claimed at once
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE channel = 'push' AND state = 'PENDING'
		AND attempt_count = 0 AND next_attempt_at <= now()`), int64(3)) // push tasks due, left alone

	e.waitDB(`(SELECT paused_until <= now() FROM channel_rate_limit WHERE channel = 'push')`)
	pushed := 0
	testworld.Eventually(t, 30*time.Second, "B claims the push tasks", func() bool { // refilling from empty at 100/s
		attempts, _, err = b.ClaimBatch(e.ctx, 10)
		is.NoErr(err)
		for _, at := range attempts {
			if at.Channel == "push" {
				pushed++
			}
		}
		return pushed >= 3
	})
	is.True(pushed >= 3) // after the pause B claims the push tasks
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
		WHERE t.channel = 'push' AND n.event_key LIKE 'next-%' AND t.state = 'SENDING'`), int64(3)) // all three
}

// Several 429s of one channel in one finish pause it once, for the longest Retry-After among them
// (a missing one counting as DefaultThrottlePause), wherever that one stands in the group: the channel
// asked every caller to wait at least that long.
func TestRateLimitPauseTakesTheLongestRetryAfter(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.dueTasks(4)
	var pauses []time.Duration
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: 100, Burst: 100}},
		onPause: func(p service.RatePauseEvent) {
			is.NoErr(p.Err)
			pauses = append(pauses, p.Pause)
		}})
	attempts, _, err := d.ClaimBatch(e.ctx, 4)
	is.NoErr(err)
	is.Equal(len(attempts), 4) // one group of four push tasks
	throttled := func(retryAfter time.Duration) delivery.Observation {
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: retryAfter, Detail: "HTTP 429"}
	}
	// The longest is neither the first nor the last; one has no Retry-After at all.
	obs := []delivery.Observation{throttled(2 * time.Second), throttled(7 * time.Second), throttled(0), throttled(3 * time.Second)}
	_, err = d.FinishBatch(e.ctx, attempts, obs)
	is.NoErr(err)
	is.Equal(pauses, []time.Duration{7 * time.Second}) // one pause, the longest
	is.Equal(e.bucket("push").pause, 7.0)              // as the bucket holds it, on the database clock
}

// A 429 without Retry-After pauses the channel for DefaultThrottlePause; a longer pause already
// running is kept.
func TestRateLimitPauseWithoutRetryAfter(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.push.ScriptSend(e.ref(id), fakes.Step{Status: 429})
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: 100, Burst: 100}}})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeThrottled)
	is.Equal(e.bucket("push").pause, service.DefaultThrottlePause.Seconds()) // 1 s

	_, err := dbgen.New(e.pool).RateLimitPause(e.ctx, dbgen.RateLimitPauseParams{Channel: "push", PauseSeconds: 30})
	is.NoErr(err)
	_, err = dbgen.New(e.pool).RateLimitPause(e.ctx, dbgen.RateLimitPauseParams{Channel: "push", PauseSeconds: 1})
	is.NoErr(err)
	is.True(e.bucket("push").pausedFor > 20) // the 1 s pause did not shorten the 30 s one
}

// Configuring a bucket: a new one starts full; the last worker to start sets rate and burst and keeps
// what the bucket holds (clamped to the new burst); a pause survives it. A worker without a limit of
// its own honours a bucket another worker set; one that never configured consults none.
func TestRateLimitConfigure(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "t-", 10)
	e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: slow, Burst: 8}}})
	b := e.bucket("push")
	is.True(b.tokens > 7.99 && b.tokens <= 8) // full
	e.setTokens("push", 3)
	e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: 2 * slow, Burst: 20}}})
	b = e.bucket("push")
	is.Equal(b.burst, 20.0)                     // the last start wins
	is.Equal(b.rate, 2*slow)                    // rate too
	is.True(b.tokens > 2.99 && b.tokens < 3.01) // and what it held stays
	d := e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: slow, Burst: 2}}})
	is.True(e.bucket("push").tokens <= 2) // clamped to the new burst

	_, err := dbgen.New(e.pool).RateLimitPause(e.ctx, dbgen.RateLimitPauseParams{Channel: "push", PauseSeconds: 60})
	is.NoErr(err)
	e.dispatcher(dcfg{rateLimits: map[string]delivery.RateLimit{"push": {PerSecond: 100, Burst: 100}}})
	b = e.bucket("push")
	is.True(b.pausedFor > 50) // the pause stays
	is.Equal(b.tokens, 0.0)   // holding nothing meanwhile
	attempts, _, err := d.ClaimBatch(e.ctx, 5)
	is.NoErr(err)
	is.Equal(len(attempts), 0) // paused

	other := e.dispatcher(dcfg{worker: "w-other"}) // no limit of its own
	attempts, _, err = other.ClaimBatch(e.ctx, 5)
	is.NoErr(err)
	is.Equal(len(attempts), 0) // it honours the bucket

	// Lifting a limit is deleting its row (the owner): workers that consulted it see no limit at once.
	_, err = e.pool.Exec(e.ctx, `DELETE FROM channel_rate_limit WHERE channel = 'push'`)
	is.NoErr(err)
	attempts, _, err = other.ClaimBatch(e.ctx, 5)
	is.NoErr(err)
	is.Equal(len(attempts), 5) // no row, no limit

	bad, err := service.NewDispatcher(t.Context(), e.workerPool, service.DispatcherConfig{Worker: "w-bad",
		Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: answering{},
			RateLimit: delivery.RateLimit{PerSecond: 10, Burst: 0.5}}}})
	is.True(bad == nil)
	is.True(errors.Is(err, delivery.ErrInvalidInput))                       // a burst under one is refused
	is.Equal(e.scalar(`SELECT count(*) FROM channel_rate_limit`), int64(0)) // before anything is written
}

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
	}{
		{"50/s", 50}, {"3000/min", 50}, {"36/h", 0.01}, {"0.5/s", 0.5}, {" 20 / s ", 20}, {"1000000/s", 1e6},
	} {
		got, err := delivery.ParseRate(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "50", "0/s", "-1/s", "fast", "50/day", "50/S", "NaN/s", "Inf/s", "1e309/s", "1000001/s", "/s", "5/"} {
		if got, err := delivery.ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) = %v, want an error", in, got)
		} else if !strings.Contains(err.Error(), "want a positive number of calls per s, min or h") {
			t.Errorf("ParseRate(%q): %v: does not say what is wanted", in, err)
		}
	}
}

// BenchmarkClaimRateLimited is BenchmarkClaim on a channel with a rate limit that never runs out: one
// claim of one task per iteration, with RateLimitPeek and RateLimitTake in its transaction. lock-us/op
// is how long the claim held the channel's bucket locked (from RateLimitTake's start to the claim's
// return, which follows its COMMIT): the time other workers' claims of that channel wait.
//
//	go test -run '^$' -bench 'BenchmarkClaim' -benchtime=2000x ./service/
func BenchmarkClaimRateLimited(b *testing.B) {
	e := newEnv(b)
	e.dueTasks(b.N)
	timer := &takeTimer{}
	cfg, err := pgxpool.ParseConfig(e.workerPool.Config().ConnString())
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = timer
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	d := tracedDispatcher(b, e, pool, delivery.RateLimit{PerSecond: delivery.MaxRate, Burst: delivery.MaxRate})
	var held time.Duration
	b.ResetTimer()
	for range b.N {
		attempts, _, err := d.ClaimBatch(e.ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		held += time.Since(timer.started.Load().(time.Time))
		if len(attempts) != 1 {
			b.Fatalf("claimed %d tasks, want 1", len(attempts))
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(held.Microseconds())/float64(b.N), "lock-us/op")
}

// takeTimer notes when RateLimitTake was last sent.
type takeTimer struct{ started atomic.Value }

func (t *takeTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(data.SQL, "-- name: RateLimitTake ") {
		t.started.Store(time.Now())
	}
	return ctx
}

func (t *takeTimer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A limited channel's claim waits on the database four times instead of two: BEGIN with RateLimitPeek,
// TaskClaim, RateLimitTake, TaskStartAttempts with COMMIT. A throttled one costs what an idle claim
// costs: BEGIN with the peek, then COMMIT.
func TestRateLimitClaimRoundTrips(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "t-", 5)
	cfg, err := pgxpool.ParseConfig(e.workerPool.Config().ConnString())
	is.NoErr(err)
	trips := &roundTrips{}
	cfg.ConnConfig.DialFunc = trips.dial
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	d := tracedDispatcher(t, e, pool, delivery.RateLimit{PerSecond: slow, Burst: 1})
	claim := func() (int, int64) {
		start := trips.n.Load()
		attempts, _, err := d.ClaimBatch(e.ctx, 1)
		is.NoErr(err)
		return len(attempts), trips.n.Load() - start
	}
	claim() // statements prepared
	e.setTokens("push", 1)
	n, rt := claim()
	is.Equal(n, 1)         // a task claimed with the token
	is.Equal(rt, int64(4)) // in four round trips
	n, rt = claim()
	is.Equal(n, 0)         // no token
	is.Equal(rt, int64(2)) // two round trips, TaskClaim not sent
}
