package service_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/seedcase"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/worker"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// env is one test's world (testworld.World: a fresh database and the three fake channels), with the
// service's own helpers around it. The short names alias the world's fields.
type env struct {
	t               testing.TB
	ctx             context.Context
	w               *testworld.World
	pool            *pgxpool.Pool
	workerPool      *pgxpool.Pool // the same database, connections set up as a worker's (dispatchers use it)
	n               *service.Notifier
	push, sms, none *fakes.Channel
}

func newEnv(t testing.TB) *env {
	t.Helper()
	runParallel(t)
	w := testworld.New(t)
	return &env{t: t, ctx: context.Background(), w: w, pool: w.Pool, workerPool: w.WorkerPool, n: w.Notifier,
		push: w.Push, sms: w.SMS, none: w.None}
}

// dcfg are the knobs tests turn; zero fields get the world's short test defaults.
type dcfg struct {
	worker     string
	lease      time.Duration
	timeout    time.Duration
	backoff    time.Duration                   // the first retry; the longest is ten times it
	modes      map[string]delivery.Mode        // override a channel's declared mode (negative controls)
	contracts  map[string]delivery.Contract    // a channel's contract settings
	rateLimits map[string]delivery.RateLimit   // the rate limits this worker sets (written by NewDispatcher)
	onRate     func(channel string)            // Observer.RateLimited
	onPause    func(service.RatePauseEvent)    // Observer.RatePaused
	configure  func(*service.DispatcherConfig) // any other setting, applied last
}

// testBatch is the claim batch size the seed tests run with: 1 (per task) by default,
// NOTIFIER_TEST_BATCH=n runs every cycle through the batched claim and finish.
var testBatch = func() int {
	n, err := strconv.Atoi(os.Getenv("NOTIFIER_TEST_BATCH"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}()

// dispatcher is a service.Dispatcher whose cycles run batched when testBatch > 1; results of a batch
// are handed out one per runOnce, so tests read the same either way.
type dispatcher struct {
	*service.Dispatcher
	pending []service.Result
}

// dispatcher is a dispatcher on the worker pool; secDispatcher puts one on another pool.
func (e *env) dispatcher(c dcfg) *dispatcher {
	e.t.Helper()
	return e.dispatcherOn(e.workerPool, c)
}

func (e *env) dispatcherOn(pool *pgxpool.Pool, c dcfg) *dispatcher {
	e.t.Helper()
	cfg := service.DispatcherConfig{
		Worker: c.worker, Routes: e.w.Routes(c.modes, c.contracts, c.rateLimits), Lease: c.lease, CallTimeout: c.timeout,
		Backoff:  delivery.Backoff{Base: c.backoff, Max: 10 * c.backoff},
		Observer: testObserver{rateLimited: c.onRate, ratePaused: c.onPause},
	}
	if c.configure != nil {
		c.configure(&cfg)
	}
	return &dispatcher{Dispatcher: e.w.DispatcherOn(pool, cfg)}
}

// create submits an event and returns its single task id on channel.
func (e *env) create(user, key string, ttl time.Duration, maxAttempts int) []service.TaskRef {
	e.t.Helper()
	_, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: user, EventKey: key, Body: "body of " + key, TTL: ttl, MaxAttempts: maxAttempts})
	if err != nil || !created {
		e.t.Fatalf("create %s/%s: created=%v err=%v", user, key, created, err)
	}
	return tasks
}

func (e *env) task(id int64) service.Task {
	e.t.Helper()
	task, err := e.n.Task(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return task
}

func (e *env) outcomes(id int64) []delivery.Outcome {
	e.t.Helper()
	attempts, err := e.n.Attempts(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]delivery.Outcome, len(attempts))
	for i, a := range attempts {
		out[i] = a.Outcome
	}
	return out
}

func (e *env) attempts(id int64) []service.AttemptRecord {
	e.t.Helper()
	attempts, err := e.n.Attempts(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return attempts
}

func (e *env) scalar(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// quiet is the log of the cycles tests run: their results are what the tests read.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runCycle is the production one-task cycle (worker.RunOnce, as `notifier work --once` runs it). A
// failed finish (UNRECORDED) and a task set aside come back as their result, not as an error: the
// worker returns them as errors for the command's exit code, the tests read the result.
func runCycle(ctx context.Context, d worker.Dispatcher) (service.Result, error) {
	res, err := worker.RunOnce(ctx, d, quiet, nil)
	if err != nil && (res.Kind == service.ResultUnrecorded || res.Kind == service.ResultSetAside) {
		return res, nil
	}
	return res, err
}

// runBatch claims up to batch due tasks in one transaction, calls their channels concurrently outside
// any transaction, and records all observations in one transaction. It returns the results of
// claim-time decisions and of calls; none when nothing was due. worker.RunOnce claims one task, and
// the streaming loop (worker.Run) runs until stopped, so a batch a test counts on goes through
// ClaimBatch, callAll and FinishBatch here.
func runBatch(ctx context.Context, d worker.Dispatcher, batch int) ([]service.Result, error) {
	attempts, settled, err := d.ClaimBatch(ctx, batch)
	if err != nil || len(attempts) == 0 {
		return settled, err
	}
	finished, err := d.FinishBatch(ctx, attempts, callAll(ctx, d, attempts))
	return append(settled, finished...), err
}

// callAll calls the channels of a batch concurrently; the observations are in the order of attempts.
func callAll(ctx context.Context, d worker.Dispatcher, attempts []*service.Attempt) []delivery.Observation {
	obs := make([]delivery.Observation, len(attempts))
	var wg sync.WaitGroup
	for i, a := range attempts {
		wg.Go(func() { obs[i] = d.Call(ctx, a) })
	}
	wg.Wait()
	return obs
}

// claimOne claims one task (ClaimBatch with a batch of one), for a test that acts between the claim
// and the finish. Without an Attempt, the Result says what was decided without a call (NOTHING,
// SUPPRESSED, FAILED, PARKED).
func claimOne(ctx context.Context, d worker.Dispatcher) (*service.Attempt, service.Result, error) {
	attempts, settled, err := d.ClaimBatch(ctx, 1)
	switch {
	case err != nil:
		return nil, service.Result{}, err
	case len(attempts) == 1:
		a := attempts[0]
		return a, service.Result{Kind: service.ResultKind(delivery.StateSending), TaskID: a.TaskID, Channel: a.Channel,
			Attempt: a.No, Action: a.Action, Token: a.Token}, nil
	case len(settled) == 1:
		return nil, settled[0], nil
	}
	return nil, service.Result{Kind: service.ResultNothing}, nil
}

// finishOne records one observation: FinishBatch with a batch of one.
func finishOne(ctx context.Context, d worker.Dispatcher, a *service.Attempt, obs delivery.Observation) (service.Result, error) {
	results, err := d.FinishBatch(ctx, []*service.Attempt{a}, []delivery.Observation{obs})
	if err != nil {
		return service.Result{}, err
	}
	return results[0], nil
}

// runOnce runs one cycle (or hands out the next result of a batched one) and fails the test on error.
func runOnce(t testing.TB, d *dispatcher) service.Result {
	t.Helper()
	if testBatch == 1 {
		res, err := runCycle(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if len(d.pending) == 0 {
		results, err := runBatch(context.Background(), d, testBatch)
		if err != nil {
			t.Fatal(err)
		}
		d.pending = results
	}
	if len(d.pending) == 0 {
		return service.Result{Kind: service.ResultNothing}
	}
	res := d.pending[0]
	d.pending = d.pending[1:]
	return res
}

// runNext runs cycles until one finds a task (its backoff has passed on the database clock), for at
// most 30 s.
func runNext(t testing.TB, d *dispatcher) service.Result {
	t.Helper()
	var res service.Result
	testworld.Eventually(t, 30*time.Second, "a task due", func() bool {
		res = runOnce(t, d)
		return res.Kind != service.ResultNothing
	})
	return res
}

// waitDB waits until the SQL condition holds on the database clock (at most 30 s).
func (e *env) waitDB(cond string, args ...any) {
	e.t.Helper()
	testworld.Eventually(e.t, 30*time.Second, "the database condition "+cond, func() bool {
		var ok bool
		if err := e.pool.QueryRow(e.ctx, "SELECT "+cond, args...).Scan(&ok); err != nil {
			e.t.Fatal(err)
		}
		return ok
	})
}

func outcomes(o ...delivery.Outcome) []delivery.Outcome { return o }

// withoutStateMachine runs f with schema/003's state machine switched off on delivery_task (both its
// triggers), and switches it on again: for negative controls, which show the damage an unsafe statement
// would do if nothing but the protocol's own guards stood in its way, and for tests that rewrite history
// as no move would (moving a finished task's updated_at into the past). Test-only, on the test's own
// database: the tables' owner may ALTER them, which no rule inside the database can prevent.
func (e *env) withoutStateMachine(f func()) {
	e.t.Helper()
	set := func(how string) {
		if _, err := e.pool.Exec(e.ctx, `ALTER TABLE delivery_task `+how+` TRIGGER USER`); err != nil {
			e.t.Fatalf("%s the state machine: %v", how, err)
		}
	}
	set("DISABLE")
	defer set("ENABLE")
	f()
}

// finishHistory finishes history made directly (test-only SQL) the way workers would have, keeping its
// dates: every SENDING task inserted with an attempt_token gets its open SEND attempt (started when the
// task was claimed), the channel accepted it, and the task is SENT. The state machine (schema/003)
// accepts only history made by its moves: a call's attempt is opened by its holder, a finish follows.
var finishHistory = []string{
	`INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, started_at)
	 SELECT t.id, t.attempt_count, t.attempt_token, 'SEND', t.lease_owner, t.updated_at
	 FROM delivery_task t
	 WHERE t.state = 'SENDING' AND NOT EXISTS (SELECT FROM delivery_attempt a WHERE a.attempt_token = t.attempt_token)`,
	`UPDATE delivery_attempt a SET outcome = 'ACCEPTED', finished_at = a.started_at, provider_msg_id = 'msg-' || a.task_id
	 FROM delivery_task t WHERE t.attempt_token = a.attempt_token AND t.state = 'SENDING' AND a.outcome IS NULL`,
	`UPDATE delivery_task SET state = 'SENT', provider_msg_id = 'msg-' || id, lease_owner = NULL, lease_until = NULL
	 WHERE state = 'SENDING' AND lease_owner IS NOT NULL`,
}

var _ = is.New

// ref is a task's channel reference (random, stored with the task: schema/001), what the fakes file its
// requests under.
func (e *env) ref(taskID int64) string {
	e.t.Helper()
	task, err := e.n.Task(e.ctx, taskID)
	if err != nil {
		e.t.Fatal(err)
	}
	return task.Ref
}

// checkSeed holds a seed case's task to the case's expected end (testdata/seed/traces.json), with what
// fake counted under its reference.
func (e *env) checkSeed(name string, taskID int64, fake *fakes.Channel) {
	e.t.Helper()
	task := e.task(taskID)
	got := seedcase.Got{State: string(task.State), Parked: task.NeedsReview,
		Sends: fake.Sends(task.Ref), Queries: fake.Queries(task.Ref), Outbound: fake.Outbound(task.Ref)}
	for _, a := range e.attempts(taskID) {
		got.Outcomes = append(got.Outcomes, string(a.Outcome))
		got.LateOutcomes = append(got.LateOutcomes, string(a.LateOutcome))
	}
	seedcase.Check(e.t, name, got)
}

// testObserver hands the dispatcher events a test watches to its funcs (nil: ignored). The funcs run
// on the goroutine of the claim or finish.
type testObserver struct {
	service.NopObserver
	rateLimited    func(channel string)
	ratePaused     func(service.RatePauseEvent)
	accountPaused  func(service.AccountPauseEvent)
	accountResumed func(service.AccountResumeEvent)
	finishRetried  func(service.FinishRetryEvent)
	claimRecovered func(attempts int, err error)
}

func (o testObserver) RateLimited(channel string) {
	if o.rateLimited != nil {
		o.rateLimited(channel)
	}
}

func (o testObserver) RatePaused(e service.RatePauseEvent) {
	if o.ratePaused != nil {
		o.ratePaused(e)
	}
}

func (o testObserver) AccountPaused(e service.AccountPauseEvent) {
	if o.accountPaused != nil {
		o.accountPaused(e)
	}
}

func (o testObserver) AccountResumed(e service.AccountResumeEvent) {
	if o.accountResumed != nil {
		o.accountResumed(e)
	}
}

func (o testObserver) FinishRetried(e service.FinishRetryEvent) {
	if o.finishRetried != nil {
		o.finishRetried(e)
	}
}

func (o testObserver) ClaimRecovered(attempts int, err error) {
	if o.claimRecovered != nil {
		o.claimRecovered(attempts, err)
	}
}

// parallel remembers the tests runParallel made parallel: a test that builds a second env must not
// call t.Parallel again.
var parallel sync.Map

// runParallel lets a top-level test that owns its database (every env has its own, from pgtest) run
// beside the others: most of the package's time is tests waiting on leases, timeouts and fakes, not
// the CPU. A subtest stays in its parent's order (its parent may clean up after it with defer), and
// NOTIFIER_TEST_SERIAL=1 runs the tests one at a time, to tell a parallel-only failure apart.
func runParallel(t testing.TB) {
	tt, ok := t.(*testing.T)
	if !ok || strings.Contains(tt.Name(), "/") || os.Getenv("NOTIFIER_TEST_SERIAL") == "1" {
		return
	}
	if _, again := parallel.LoadOrStore(tt, true); !again {
		tt.Parallel()
	}
}
