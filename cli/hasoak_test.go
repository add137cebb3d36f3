package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgha"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/primary"
	"github.com/notifierhq/notifier/service"
)

// The failover soak (`just ha-soak`, docs/testing.md#failover-soak): notifier work processes and a
// stream of creates on a pg_auto_failover cluster whose primary node is SIGKILLed again and again.
var (
	haSoak      = flag.Bool("ha.soak", false, "run TestHASoak, the failover soak on pg_auto_failover (just ha-soak)")
	haFailovers = flag.Int("ha.failovers", 5, "primary kills in the synchronous soak")
	haControl   = flag.Bool("ha.control", true, "also run the asynchronous negative controls (one kill each)")
	haWorkers   = flag.Int("ha.workers", 2, "notifier work processes")
	haRate      = flag.Int("ha.rate", 30, "new events a second, each submitted 1-3 times at once, a fifth of them again later")
	haSteady    = flag.Duration("ha.steady", 5*time.Second, "load on a healthy cluster before each kill")
	haStall     = flag.Duration("ha.stall", 1500*time.Millisecond, "asynchronous controls: the walsender is stopped this long before the kill")
	haLease     = flag.Duration("ha.lease", 0, "the workers' --lease (0: work's default, 30s)")
	haDefaults  = flag.Bool("ha.default-timeouts", false, "keep pg_auto_failover's own failover timeouts (~50 s a failover)")
	haBound     = flag.Duration("ha.bound", haFailoverBound, "the synchronous soak fails when a failover's kill -> a create answered takes longer (0: no bound)")
)

// haFailoverBound is the longest kill -> a create answered the synchronous soak accepts with the
// lowered timeouts (docs/operations.md#failover-timing): the monitor's ~8-10 s to fail over, a create
// try's 5 s timeout, with room for a loaded shared machine.
const haFailoverBound = 30 * time.Second

// haUsers each have push, sms and none: every event makes three tasks.
const haUsers = 100

func TestHASoak(t *testing.T) {
	if !*haSoak {
		t.Skip("the failover soak runs with -ha.soak (sh internal/tools/just ha-soak)")
	}
	// Synchronous replication (pg_auto_failover's default): no acknowledged create and no attempt row
	// is lost, whatever the kills.
	t.Run("sync", func(t *testing.T) {
		is := is.New(t)
		r := runHASoak(t, haRun{failovers: *haFailovers})
		is.Equal(r.failovers, *haFailovers) // every kill was followed by a new primary and a rejoin
		is.Equal(r.v.total(), 0)            // no violation
		is.True(r.v.tasks > 100)            // the soak did real work
		if *haBound > 0 && !*haDefaults {
			for i, d := range r.createAnswered {
				if d < 0 || d > *haBound {
					t.Errorf("failover %d: kill -> a create answered %s, above the bound of %s (docs/operations.md#failover-timing); -1s: no create answered",
						i+1, d.Round(100*time.Millisecond), *haBound)
				}
			}
		}
	})
	if !*haControl {
		return
	}
	// Negative control: asynchronous replication, the walsender stalled before the kill. The new
	// primary lacks the last acknowledged commits: creates that answered created=true, and the attempt
	// rows of calls that reached a channel. With random refs, no channel mistakes a new task for a
	// lost one.
	t.Run("async-control", func(t *testing.T) {
		is := is.New(t)
		r := runHASoak(t, haRun{failovers: 1, async: true})
		is.Equal(r.failovers, 1)
		is.True(r.lostCreates > 0)                                                        // acknowledged creates lost: the damage asynchronous replication does
		is.True(r.requestsWithoutRow() > 0)                                               // requests on the wire without an attempt row
		is.Equal(r.falseReplays(), 0)                                                     // and yet no replay or query answered for another task's message
		is.Equal(r.v.violations["I10 a message under a task's ref is another task's"], 0) // nor a ref that named two tasks
	})
	// Negative control of the random ref: the same, with each new task's ref its id (task-<id>), as
	// before refs were random. The lost ids are handed out again, and the channels answer the new tasks with
	// the lost ones' messages.
	t.Run("async-id-refs-control", func(t *testing.T) {
		is := is.New(t)
		r := runHASoak(t, haRun{failovers: 1, async: true, idRefs: true})
		is.Equal(r.failovers, 1)
		is.True(r.lostCreates > 0)    // as above
		is.True(r.falseReplays() > 0) // SENT on a replay or a query of a message the task never sent
	})
}

// haRun is one soak's setting.
type haRun struct {
	failovers int
	async     bool // replication-quorum false, walsender stalled before each kill
	idRefs    bool // new tasks take ref task-<id> (a trigger in the soak's database)
}

// haResult is what a soak measured.
type haResult struct {
	v              *soakVerdict
	failovers      int
	lostCreates    int
	createAnswered []time.Duration // per failover: kill -> a create answered; -1 s when none was
}

func (r haResult) requestsWithoutRow() int {
	return r.v.violations["I8 requests for a ref no task has"] + r.v.violations["I8 more requests on the wire than call attempts"]
}

func (r haResult) falseReplays() int {
	return r.v.violations["I10 a replay or a query found a message the task never sent"]
}

// haSoakRun holds one soak's moving parts.
type haSoakRun struct {
	t       *testing.T
	run     haRun
	cluster *pgha.Cluster
	pool    *pgxpool.Pool // through the multi-host URL: the current primary
	n       *service.Notifier
	c       notifierCLI
	push    *fakes.Channel
	sms     *fakes.Channel
	none    *fakes.Channel

	// inFlight holds a slot per create try in flight, as many as the pool has connections: a try
	// starts its 5 s timeout only once it has one, instead of spending it queued on the pool.
	inFlight chan struct{}

	mu       sync.Mutex
	answers  []createAnswer
	tries    []createTry // every create call, answered or not
	failures int         // create calls that failed (and were retried, as a client would)
	logs     []*syncBuffer
	exits    []string // workers that exited by themselves (restarted, as systemd would)
	stopping bool
}

// createAnswer is one create call that got an answer.
type createAnswer struct {
	user, event       string
	created           bool
	id                int64
	tasks             []service.TaskRef
	started, answered time.Time
}

// createTry is one create call: how it ended, on which server, after how long.
type createTry struct {
	started  time.Time
	took     time.Duration
	err      string // "" when answered
	sqlState string // the server's SQLSTATE, when it answered with an error
	host     string // the server the last statement went to; "" when none was sent (no connection)
	stmt     string // the statement in flight when the try ended with an error ("" when none was)
}

// tryTrace records, for one create call, which server its statements went to and which one was in
// flight (haTracer fills it in; the call carries it in its context).
type tryTrace struct {
	mu         sync.Mutex
	host, stmt string
}

type tryTraceKey struct{}

// haTracer puts each statement's server and text into the tryTrace of its call's context.
type haTracer struct{}

func (haTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if tr, ok := ctx.Value(tryTraceKey{}).(*tryTrace); ok {
		tr.mu.Lock()
		tr.host, tr.stmt = conn.PgConn().Conn().RemoteAddr().String(), firstWord(data.SQL)
		tr.mu.Unlock()
	}
	return ctx
}

func (haTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if tr, ok := ctx.Value(tryTraceKey{}).(*tryTrace); ok && data.Err == nil {
		tr.mu.Lock()
		tr.stmt = ""
		tr.mu.Unlock()
	}
}

// firstWord is a statement's name as sqlc writes it ("-- name: NotificationCreate :one"), or its first word.
func firstWord(sql string) string {
	sql = strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(sql, "-- name: "); ok {
		sql = rest
	}
	w, _, _ := strings.Cut(sql, " ")
	return strings.ToLower(strings.TrimSpace(w))
}

// failover is what one kill of the primary cost.
type failover struct {
	killed, promoted string
	killedAt         time.Time
	harnessSaw       time.Duration // until the harness saw the other node take writes
	rejoined         time.Duration // until the killed node was the standby again, from the kill
}

func runHASoak(t *testing.T, run haRun) haResult {
	t.Helper()
	is := is.New(t)
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cluster, err := pgha.Start(startCtx, pgha.Options{Async: run.async, DefaultTimeouts: *haDefaults, Logf: t.Logf})
	is.NoErr(err) // pg_auto_failover cluster (just ha-soak installs it)
	t.Cleanup(func() {
		if err := cluster.Close(); err != nil {
			t.Error(err)
		}
	})
	// dbmate reads one host: migrate the primary, found from the multi-host URL as `just migrate` does.
	primaryURL, err := primary.URL(startCtx, cluster.URL(), 5*time.Second)
	is.NoErr(err)
	is.NoErr(pgtest.Migrate(startCtx, primaryURL))
	cfg, err := pgxpool.ParseConfig(cluster.URL() + "&connect_timeout=2")
	is.NoErr(err)
	cfg.MaxConns = 16
	cfg.ConnConfig.Tracer = haTracer{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	if run.idRefs {
		_, err := pool.Exec(ctx, `CREATE FUNCTION soak_ref_is_id() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN NEW.ref := 'task-' || NEW.id; RETURN NEW; END $$;
			CREATE TRIGGER soak_ref_is_id BEFORE INSERT ON delivery_task FOR EACH ROW EXECUTE FUNCTION soak_ref_is_id()`)
		is.NoErr(err) // refs as they were before they were random
	}
	s := &haSoakRun{t: t, run: run, cluster: cluster, pool: pool, n: service.NewNotifier(pool),
		inFlight: make(chan struct{}, cfg.MaxConns),
		c:        notifierCLI{t: t, dbURL: cluster.URL()}}
	for i := range haUsers {
		u := fmt.Sprintf("u%d", i+1)
		for _, ch := range []string{"push", "sms", "none"} {
			_, err := s.n.SetPreference(ctx, u, ch, u+"@"+ch, true)
			is.NoErr(err) // preference
		}
	}
	// Channels that answer as providers do, after 100-200 ms.
	s.push, s.sms, s.none = startFake(t, fakes.Push), startFake(t, fakes.SMS), startFake(t, fakes.None)
	latency := func() fakes.Step { return fakes.Step{Delay: time.Duration(100+rand.IntN(100)) * time.Millisecond} }
	for _, ch := range []*fakes.Channel{s.push, s.sms, s.none} {
		ch.SetFallback(latency, nil)
	}
	observeCtx, stopObserving := context.WithCancel(ctx)
	observed := make(chan struct{})
	go func() { defer close(observed); cluster.Observe(observeCtx, 250*time.Millisecond, t.Logf) }()
	defer func() { stopObserving(); <-observed }()
	stopWorkers := s.startWorkers(*haWorkers)
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := s.load(loadCtx)

	var failovers []failover
	for i := 0; i < run.failovers; i++ {
		is.NoErr(cluster.WaitHealthy(ctx)) // never a second failure while the standby catches up
		time.Sleep(*haSteady)
		var resume func()
		if run.async {
			resume, err = cluster.StallWalsender(ctx)
			is.NoErr(err)
			time.Sleep(*haStall)
		}
		old, err := cluster.KillPrimary(ctx)
		is.NoErr(err) // kill the primary node
		f := failover{killed: old.Name, killedAt: time.Now()}
		t.Logf("ha soak: failover %d: %s killed at %s", i+1, old.Name, f.killedAt.Format("15:04:05.000"))
		if resume != nil {
			resume() // its walsender died with it; nothing to thaw
		}
		promoted, err := cluster.WaitPrimary(ctx, old)
		is.NoErr(err) // a new primary
		f.promoted, f.harnessSaw = promoted.Name, time.Since(f.killedAt)
		is.NoErr(cluster.Rejoin(ctx, old)) // the killed node comes back as the standby
		f.rejoined = time.Since(f.killedAt)
		failovers = append(failovers, f)
	}
	time.Sleep(*haSteady) // the last failover's recovery is measured under load too
	stopLoad()
	<-loadDone

	// Drain: every task final or parked. Bounded: what is still stuck afterwards is a violation (I5).
	drained := s.drain(ctx, 3*time.Minute)
	stopWorkers()
	v := checkInvariants(t, soakEvidence{pool: pool, logs: s.logs,
		channels: map[string]*fakes.Channel{"push": s.push, "sms": s.sms, "none": s.none}})
	lost, lostTasks, twice := s.checkCreates()
	v.add("R1 a create answered created=true without its row", lost)
	v.add("R1 a task a create answered without its row", lostTasks)
	v.add("R1 an event answered created=true more than once", twice)
	answered := s.report(failovers, v, drained)
	return haResult{v: v, failovers: len(failovers), lostCreates: lost, createAnswered: answered}
}

// startWorkers runs n notifier work processes with work's defaults (lease 30 s, timeout 10 s, window
// 1024) on the multi-host URL. One that exits by itself is started again, as systemd would, and
// counted. The returned func stops them all with SIGTERM, each of which must exit 0.
func (s *haSoakRun) startWorkers(n int) (stop func()) {
	var wg sync.WaitGroup
	procs := make([]*process, n)
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := 0; ; start++ {
				s.mu.Lock()
				stopping := s.stopping
				s.mu.Unlock()
				if stopping {
					return
				}
				args := []string{"--log-format", "json", "work", "--worker-id", fmt.Sprintf("ha-%d-%d", i, start),
					"--channel", "push=idempotent," + s.push.URL(),
					"--channel", "sms=queryable," + s.sms.URL(),
					"--channel", "none=none," + s.none.URL()}
				if *haLease > 0 {
					args = append(args, "--lease", haLease.String())
				}
				p := s.c.start(args...)
				mu.Lock()
				procs[i] = p
				mu.Unlock()
				s.mu.Lock()
				s.logs = append(s.logs, p.stderr)
				s.mu.Unlock()
				<-p.done
				s.mu.Lock()
				stopping = s.stopping
				if !stopping {
					s.exits = append(s.exits, fmt.Sprintf("worker %d exited %d: %s", i, p.cmd.ProcessState.ExitCode(),
						tail(p.stderr.String(), 600)))
				}
				s.mu.Unlock()
				if stopping {
					return
				}
				time.Sleep(time.Second) // systemd's RestartSec
			}
		}()
	}
	return func() {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		mu.Lock()
		for i, p := range procs {
			select {
			case <-p.done:
				continue // exited by itself (counted), not restarted now
			default:
			}
			if code := p.stop(syscall.SIGTERM); code != 0 {
				s.t.Errorf("worker %d exited %d on SIGTERM; stderr tail:\n%s", i, code, tail(p.stderr.String(), 2000))
			}
		}
		mu.Unlock()
		wg.Wait()
	}
}

// load submits new events at -ha.rate until ctx ends: each 1-3 times at once (concurrent
// duplicates), a fifth of them once more 1-5 s later (a client that resubmits), every submission
// retried until it gets an answer (a client riding out the failover). Every body is unique, so that
// the checker can tell whose message a channel holds. The returned channel closes once every
// submission has its answer.
func (s *haSoakRun) load(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second / time.Duration(*haRate))
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-tick.C:
			}
			user, event := fmt.Sprintf("u%d", 1+rand.IntN(haUsers)), fmt.Sprintf("ev-%d", n)
			body := fmt.Sprintf("ha soak: %s %s", user, event)
			for range 1 + rand.IntN(3) {
				wg.Add(1)
				go func() { defer wg.Done(); s.createUntilAnswered(user, event, body) }()
			}
			if rand.IntN(5) == 0 {
				wg.Add(1)
				time.AfterFunc(time.Duration(1000+rand.IntN(4000))*time.Millisecond, func() {
					defer wg.Done()
					s.createUntilAnswered(user, event, body)
				})
			}
		}
	}()
	return done
}

// createUntilAnswered calls create until it answers (up to 2 minutes), as a client retrying its
// submission through a failover would, and records the answer. At most one try per pooled
// connection is in flight (inFlight), and retries back off (retrySpacing): thousands of pending
// submissions sharing one pool otherwise queue on it past every try's timeout, and none is answered
// long after the new primary takes writes.
func (s *haSoakRun) createUntilAnswered(user, event, body string) {
	deadline := time.Now().Add(2 * time.Minute)
	var retry retrySpacing
	for time.Now().Before(deadline) {
		s.inFlight <- struct{}{}
		started := time.Now()
		tr := &tryTrace{}
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), tryTraceKey{}, tr), 5*time.Second)
		id, created, tasks, err := s.n.Create(ctx, service.CreateRequest{UserID: user, EventKey: event, Body: body, TTL: time.Hour, MaxAttempts: 3})
		cancel()
		<-s.inFlight
		try := createTry{started: started, took: time.Since(started)}
		tr.mu.Lock()
		try.host = tr.host
		if err != nil {
			try.err, try.sqlState, try.stmt = err.Error(), sqlStateOf(err), tr.stmt
		}
		tr.mu.Unlock()
		s.mu.Lock()
		s.tries = append(s.tries, try)
		if err == nil {
			s.answers = append(s.answers, createAnswer{user: user, event: event, created: created, id: id, tasks: tasks,
				started: started, answered: time.Now()})
		} else {
			s.failures++
		}
		s.mu.Unlock()
		if err == nil {
			return
		}
		time.Sleep(retry.next())
	}
}

// haRetryFirst and haRetryMax space a client's create retries: from 250 ms, doubling up to 2 s, each
// wait drawn at random up to the step (full jitter). A constant 200-500 ms between tries made a
// failover's backlog of clients a retry storm that kept the pool's 16 connections queued longer
// than a try's 5 s: every try timed out waiting for a connection, and creates answered 40-55 s
// after the new primary took writes (docs/benchmarks/2026-12-05-failover-recovery.md).
const (
	haRetryFirst = 250 * time.Millisecond
	haRetryMax   = 2 * time.Second
)

// retrySpacing is one client's backoff between create tries.
type retrySpacing struct{ step time.Duration }

func (r *retrySpacing) next() time.Duration {
	r.step = min(max(2*r.step, haRetryFirst), haRetryMax)
	return time.Duration(rand.Int64N(int64(r.step))) + 10*time.Millisecond
}

// drain waits until no task is PENDING, SENDING or unparked UNKNOWN, at most timeout.
func (s *haSoakRun) drain(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var open int64
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task
			WHERE state IN ('PENDING', 'SENDING') OR (state = 'UNKNOWN' AND NOT needs_review)`).Scan(&open)
		if err == nil && open == 0 {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Logf("ha soak: tasks still open %v after the load stopped", timeout)
	return false
}

// checkCreates compares every answer a create gave with the database: a created=true answer's
// notification (same id, user and event) and its tasks (same id and ref) exist, and no event was
// answered created=true twice (R1).
func (s *haSoakRun) checkCreates() (lost, lostTasks, twice int) {
	ctx := context.Background()
	s.mu.Lock()
	defer s.mu.Unlock()
	createdTimes := map[[2]string]int{}
	for _, a := range s.answers {
		if !a.created {
			continue
		}
		createdTimes[[2]string{a.user, a.event}]++
		var found bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM notification WHERE id = $1 AND user_id = $2 AND event_key = $3)`,
			a.id, a.user, a.event).Scan(&found); err != nil {
			s.t.Fatalf("read notification: %v", err)
		}
		if !found {
			lost++
		}
		for _, tk := range a.tasks {
			if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM delivery_task WHERE id = $1 AND ref = $2 AND notification_id = $3)`,
				tk.TaskID, tk.Ref, a.id).Scan(&found); err != nil {
				s.t.Fatalf("read task: %v", err)
			}
			if !found {
				lostTasks++
			}
		}
	}
	for _, n := range createdTimes {
		if n > 1 {
			twice++
		}
	}
	return lost, lostTasks, twice
}

// report prints each failover's times and the soak's counts. Failover time: from the kill to the
// first create answered by the new primary. Recovery time: from the kill to the first message a fake
// accepted after that (a claim and a call on the new primary).
func (s *haSoakRun) report(failovers []failover, v *soakVerdict, drained bool) (createAnswered []time.Duration) {
	t := s.t
	s.mu.Lock()
	answers := slices.Clone(s.answers)
	failures, exits := s.failures, slices.Clone(s.exits)
	logs := slices.Clone(s.logs)
	s.mu.Unlock()
	sort.Slice(answers, func(i, j int) bool { return answers[i].answered.Before(answers[j].answered) })
	var accepted []time.Time
	for _, ch := range []*fakes.Channel{s.push, s.sms, s.none} {
		accepted = append(accepted, ch.AcceptedAt()...)
	}
	sort.Slice(accepted, func(i, j int) bool { return accepted[i].Before(accepted[j]) })
	firstAfter := func(ts []time.Time, after time.Time) (time.Time, bool) {
		i := sort.Search(len(ts), func(i int) bool { return ts[i].After(after) })
		if i == len(ts) {
			return time.Time{}, false
		}
		return ts[i], true
	}
	answered := make([]time.Time, len(answers))
	for i, a := range answers {
		answered[i] = a.answered
	}
	mode := "synchronous replication"
	if s.run.async {
		mode = fmt.Sprintf("asynchronous replication, walsender stalled %v before each kill", *haStall)
	}
	if s.run.idRefs {
		mode += ", refs task-<id>"
	}
	if *haDefaults {
		mode += ", pg_auto_failover's default timeouts"
	}
	lease := "work's default lease"
	if *haLease > 0 {
		lease = "--lease " + haLease.String()
	}
	t.Logf("ha soak: %s; %d workers (%s), %d events/s, %d failovers", mode, *haWorkers, lease, *haRate, len(failovers))
	var writes, deliveries []time.Duration
	for i, f := range failovers {
		w, okW := firstAfter(answered, f.killedAt)
		if okW {
			createAnswered = append(createAnswered, w.Sub(f.killedAt))
		} else {
			createAnswered = append(createAnswered, -time.Second)
		}
		line := fmt.Sprintf("ha soak: failover %d: %s killed, %s promoted; harness saw writes after %.1f s", i+1, f.killed, f.promoted, f.harnessSaw.Seconds())
		if okW {
			writes = append(writes, w.Sub(f.killedAt))
			line += fmt.Sprintf("; failover (kill -> a create answered) %.1f s", w.Sub(f.killedAt).Seconds())
			if d, okD := firstAfter(accepted, w); okD {
				deliveries = append(deliveries, d.Sub(f.killedAt))
				line += fmt.Sprintf("; recovery (kill -> a message accepted) %.1f s", d.Sub(f.killedAt).Seconds())
			}
		}
		t.Logf("%s; rejoined after %.1f s", line, f.rejoined.Seconds())
		end := f.killedAt.Add(2 * time.Minute)
		if okW {
			end = w.Add(time.Second)
		}
		s.logTries(i+1, f.killedAt, end)
	}
	t.Logf("ha soak: failover min/median/max %s; recovery %s", spread(writes), spread(deliveries))
	created, duplicates := 0, 0
	for _, a := range answers {
		if a.created {
			created++
		} else {
			duplicates++
		}
	}
	retries, readOnly := 0, 0
	for _, l := range logs {
		out := l.String()
		retries += strings.Count(out, "finish failed; sending it again")
		readOnly += strings.Count(out, "read-only")
	}
	t.Logf("ha soak: creates answered %d (created %d, duplicates %d), failed and retried %d; workers' lost finishes sent again %d, log lines saying read-only %d; drained %v",
		len(answers), created, duplicates, failures, retries, readOnly, drained)
	parked := v.count(`SELECT count(*) FROM delivery_task WHERE needs_review`)
	t.Logf("ha soak: parked tasks %d (by channel: push %d, sms %d, none %d)", parked,
		v.count(`SELECT count(*) FROM delivery_task WHERE needs_review AND channel = 'push'`),
		v.count(`SELECT count(*) FROM delivery_task WHERE needs_review AND channel = 'sms'`),
		v.count(`SELECT count(*) FROM delivery_task WHERE needs_review AND channel = 'none'`))
	for _, e := range exits {
		t.Logf("ha soak: %s", e)
	}
	v.log(t)
	return createAnswered
}

// logTries prints, second by second from the kill until end, how the create tries that started then
// ended: answered or the error (SQLSTATE, the statement in flight), and on which server.
func (s *haSoakRun) logTries(n int, killedAt, end time.Time) {
	s.mu.Lock()
	tries := slices.Clone(s.tries)
	s.mu.Unlock()
	type bucket struct {
		tries   int
		ends    map[string]int
		maxTook time.Duration
	}
	var buckets []bucket
	for _, tr := range tries {
		if tr.started.Before(killedAt) || tr.started.After(end) {
			continue
		}
		sec := int(tr.started.Sub(killedAt) / time.Second)
		for len(buckets) <= sec {
			buckets = append(buckets, bucket{ends: map[string]int{}})
		}
		b := &buckets[sec]
		b.tries++
		b.maxTook = max(b.maxTook, tr.took)
		how := "answered"
		if tr.err != "" {
			how = tryErrorKind(tr)
		}
		b.ends[how+" on "+cmp.Or(tr.host, "no server")]++
	}
	for sec, b := range buckets {
		var ends []string
		for k, v := range b.ends {
			ends = append(ends, fmt.Sprintf("%d %s", v, k))
		}
		slices.Sort(ends)
		s.t.Logf("ha soak: failover %d tries +%ds: %d started, longest %.1f s: %s", n, sec, b.tries, b.maxTook.Seconds(), strings.Join(ends, "; "))
	}
}

// tryErrorKind is a failed try's error in few words: its SQLSTATE, a timeout and the statement it
// held, or a failed connect.
func tryErrorKind(tr createTry) string {
	switch {
	case tr.sqlState != "":
		return "SQLSTATE " + tr.sqlState + " at " + cmp.Or(tr.stmt, "?")
	case strings.Contains(tr.err, "failed to connect"):
		return "connect failed"
	case strings.Contains(tr.err, "deadline exceeded") || strings.Contains(tr.err, "timeout"):
		return "timeout at " + cmp.Or(tr.stmt, "acquire")
	}
	e := tr.err
	if len(e) > 60 {
		e = e[:60]
	}
	return "error " + e
}

// sqlStateOf is the SQLSTATE of the server's error in err's chain, "" when it holds none.
func sqlStateOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// spread is "min/median/max" of ds in seconds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.1f/%.1f/%.1f s", s[0].Seconds(), s[len(s)/2].Seconds(), s[len(s)-1].Seconds())
}
