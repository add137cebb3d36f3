package service_test

import (
	"context"
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
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// env is one test's world: a fresh database and the three fake channels.
type env struct {
	t               testing.TB
	ctx             context.Context
	pool            *pgxpool.Pool
	workerPool      *pgxpool.Pool // the same database, connections set up as a worker's (dispatchers use it)
	n               *service.Notifier
	push, sms, none *fakes.Channel
}

func newEnv(t testing.TB) *env {
	t.Helper()
	runParallel(t)
	e := &env{t: t, ctx: context.Background(), pool: pgtest.NewDB(t)}
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	service.ConfigureWorkerConn(cfg.ConnConfig)
	if e.workerPool, err = pgxpool.NewWithConfig(e.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.workerPool.Close)
	e.n = service.NewNotifier(e.pool)
	e.push, e.sms, e.none = fakes.Start(fakes.Push), fakes.Start(fakes.SMS), fakes.Start(fakes.None)
	t.Cleanup(func() { e.push.Close(); e.sms.Close(); e.none.Close() })
	return e
}

// dcfg are the knobs tests turn; zero fields get short test defaults.
type dcfg struct {
	worker     string
	lease      time.Duration
	timeout    time.Duration
	backoff    time.Duration
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

func (e *env) dispatcher(c dcfg) *dispatcher {
	e.t.Helper()
	if c.worker == "" {
		c.worker = "w-test"
	}
	if c.lease == 0 {
		c.lease = 10 * time.Second
	}
	if c.timeout == 0 {
		c.timeout = 2 * time.Second
	}
	if c.backoff == 0 {
		c.backoff = 50 * time.Millisecond
	}
	routes := map[string]delivery.Route{}
	for name, ch := range map[string]*fakes.Channel{"push": e.push, "sms": e.sms, "none": e.none} {
		client, err := httpchannel.New(ch.URL(), httpchannel.Options{})
		if err != nil {
			e.t.Fatal(err)
		}
		mode := map[string]delivery.Mode{"push": delivery.ModeIdempotent, "sms": delivery.ModeQueryable, "none": delivery.ModeNone}[name]
		if m, ok := c.modes[name]; ok {
			mode = m
		}
		routes[name] = delivery.Route{Mode: mode, Contract: c.contracts[name], Client: client, RateLimit: c.rateLimits[name]}
	}
	cfg := service.DispatcherConfig{
		Worker: c.worker, Routes: routes, Lease: c.lease, CallTimeout: c.timeout,
		Backoff:  delivery.Backoff{Base: c.backoff, Max: 10 * c.backoff},
		Observer: testObserver{rateLimited: c.onRate, ratePaused: c.onPause},
	}
	if c.configure != nil {
		c.configure(&cfg)
	}
	d, err := service.NewDispatcher(e.ctx, e.workerPool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return &dispatcher{Dispatcher: d}
}

// user enables the given channels for user (and nothing else).
func (e *env) user(user string, channels ...string) {
	e.t.Helper()
	for _, c := range channels {
		if _, err := e.n.SetPreference(e.ctx, user, c, user+"@"+c, true); err != nil {
			e.t.Fatal(err)
		}
	}
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

// runOnce runs one cycle (or hands out the next result of a batched one) and fails the test on error.
func runOnce(t testing.TB, d *dispatcher) service.Result {
	t.Helper()
	if testBatch == 1 {
		res, err := d.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if len(d.pending) == 0 {
		results, err := d.RunBatch(context.Background(), testBatch)
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

// runNext runs cycles until one finds a task (its backoff has passed on the database clock), for at most
// 30 s: a wait for a condition, not a fixed sleep.
func runNext(t testing.TB, d *dispatcher) service.Result {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := runOnce(t, d)
		if res.Kind != service.ResultNothing {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatal("no task became due within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDB waits until the SQL condition holds on the database clock (at most 30 s).
func (e *env) waitDB(cond string, args ...any) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		if err := e.pool.QueryRow(e.ctx, "SELECT "+cond, args...).Scan(&ok); err != nil {
			e.t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("condition %q not reached within 30s", cond)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
