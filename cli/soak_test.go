package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/receipts"
	"github.com/notifierhq/notifier/service/webhook"
)

// The soak runs notifier work processes under faults for a while, drains, and checks the invariants
// that say "nothing is lost, nothing is written off that might have gone out". It runs only with
// -soak (just test-long, which CI runs, gives 40s of faults; a long one: go test ./cli -run Soak -soak
// -soak.duration 20m -timeout 40m -v), so that just test stays short.
var (
	soakOn       = flag.Bool("soak", false, "run TestSoak (just test-long does)")
	soakDuration = flag.Duration("soak.duration", 40*time.Second, "how long the faults go on")
	soakWorkers  = flag.Int("soak.workers", 3, "worker processes")
	soakSeed     = flag.Uint64("soak.seed", 0, "random seed (0: time-based, printed)")
	soakBatch    = flag.Int("soak.batch", 0, "most tasks one claim takes (work --batch; 0: work's default)")
)

func TestSoak(t *testing.T) {
	if !*soakOn || testing.Short() {
		t.Skip("soak: runs with -soak (sh internal/tools/just test-long)")
	}
	is := is.New(t)
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	batch := "work's default"
	if *soakBatch > 0 {
		batch = strconv.Itoa(*soakBatch)
	}
	t.Logf("soak: seed %d, %s of faults, %d workers, --batch %s", seed, *soakDuration, *soakWorkers, batch)
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	chance := func(p float64) bool { rngMu.Lock(); defer rngMu.Unlock(); return rng.Float64() < p }
	pick := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	s := &soak{t: t, c: c, pool: pool, n: n}

	// Channels that misbehave at random: accept-then-timeout, accept-then-drop the (usually kept-alive)
	// connection, hang, 503, 400, 409, 429, malformed 2xx, slow bodies; queries fail or drop now and then.
	s.push, s.sms, s.none = startFake(t, fakes.Push), startFake(t, fakes.SMS), startFake(t, fakes.None)
	faults := func() fakes.Step {
		rngMu.Lock()
		defer rngMu.Unlock()
		switch r := rng.Float64(); {
		case r < 0.50:
			return fakes.Step{}
		case r < 0.55:
			return fakes.Step{Drop: true} // accepted, then the connection closes without an answer
		case r < 0.65:
			return fakes.Step{Delay: 800 * time.Millisecond} // accepted, answered after the timeout
		case r < 0.67:
			return fakes.Step{Hang: true}
		case r < 0.74:
			return fakes.Step{Status: 503}
		case r < 0.76:
			return fakes.Step{Status: 400}
		case r < 0.81:
			return fakes.Step{Status: 409}
		case r < 0.86:
			return fakes.Step{Status: 429, RetryAfter: "1"}
		case r < 0.93:
			return fakes.Step{Malformed: true}
		default:
			return fakes.Step{SlowBody: time.Second}
		}
	}
	queryFaults := func() fakes.Step {
		switch {
		case chance(0.2):
			return fakes.Step{Status: 503}
		case chance(0.05):
			return fakes.Step{Drop: true}
		}
		return fakes.Step{}
	}
	for _, ch := range []*fakes.Channel{s.push, s.sms, s.none} {
		ch.SetFallback(faults, queryFaults)
	}

	users := []string{"u1", "u2", "u3", "u4", "u5", "u6"}
	for i, u := range users {
		for j, ch := range []string{"push", "sms", "none"} {
			if (i+j)%3 != 2 { // every user has two of the three channels
				_, err := n.SetPreference(ctx, u, ch, u+"@"+ch, true)
				is.NoErr(err) // preference
			}
		}
	}

	for i := range *soakWorkers {
		s.startWorker(i)
	}
	s.receipts = newSoakReceipts(t, n)
	defer s.receipts.close()

	// Faults: kill, stop/continue and restart workers; duplicate creates; preference toggles; short TTLs;
	// the database restarted mid-run.
	deadline := time.Now().Add(*soakDuration)
	restartAt := map[int]bool{} // fractions of the run (in tenths) at which PostgreSQL restarts
	for _, f := range []int{3, 7} {
		restartAt[f] = true
	}
	events := 0
	eventUser := map[int]string{} // who each event is for: a cancel names (user, event key)
	for time.Now().Before(deadline) {
		tenth := int(10 * (1 - time.Until(deadline).Seconds()/soakDuration.Seconds()))
		switch {
		case restartAt[tenth] && pgtest.Cluster() != nil:
			delete(restartAt, tenth)
			s.restartDatabase()
		case chance(0.5):
			user := users[pick(len(users))]
			ttl := time.Hour
			if chance(0.1) {
				ttl = 1500 * time.Millisecond // expires mid-flight
			}
			events++
			eventUser[events] = user
			var chain []string
			if chance(0.4) { // a fallback chain over the three channels, in a random order
				chain = []string{"push", "sms", "none"}
				rngMu.Lock()
				rng.Shuffle(len(chain), func(i, j int) { chain[i], chain[j] = chain[j], chain[i] })
				rngMu.Unlock()
			}
			s.createConcurrently(user, fmt.Sprintf("ev-%d", events), ttl, 1+pick(3), chain)
		case events > 0 && chance(0.25):
			// A cancel of one of the last few events, its tasks anywhere in their lives: waiting,
			// unreleased, held, uncertain, parked or final (I11).
			ev := events - pick(min(events, 4))
			s.cancel(eventUser[ev], fmt.Sprintf("ev-%d", ev))
		case chance(0.3):
			s.killAndRestart(pick(*soakWorkers))
		case chance(0.3):
			s.stopAndContinue(pick(*soakWorkers), time.Duration(200+pick(1300))*time.Millisecond)
		case chance(0.2):
			u, ch := users[pick(len(users))], []string{"push", "sms", "none"}[pick(3)]
			_, _ = n.SetPreference(ctx, u, ch, u+"@"+ch, chance(0.5))
		}
		if chance(0.4) {
			// A provider's receipt for a message it accepted, now and then the same event again, half
			// of them for a task not final yet (held, uncertain, parked); and the receivers' sweep.
			ch := []*fakes.Channel{s.push, s.sms, s.none}[pick(3)]
			refs := ch.AcceptedRefs()
			if chance(0.5) {
				refs = s.unfinished(ch.Kind(), refs)
			}
			if len(refs) > 0 {
				s.receipts.send(refs[pick(len(refs))], chance(0.2))
			}
			_, _ = n.SweepReceipts(ctx, 100)
		}
		time.Sleep(time.Duration(50+pick(150)) * time.Millisecond)
	}

	// Drain: no more faults, every worker running, until every task is final or parked.
	for _, ch := range []*fakes.Channel{s.push, s.sms, s.none} {
		ch.SetFallback(nil, nil)
	}
	s.continueAll()
	testworld.Eventually(t, 3*time.Minute, "the tasks to drain", func() bool {
		if _, err := n.SweepReceipts(ctx, 1000); err != nil {
			return false // receipts noted while their task was held are settled once it is not
		}
		var open int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task
			WHERE (state = 'PENDING' AND next_attempt_at IS NOT NULL) OR state = 'SENDING'
			   OR (state = 'UNKNOWN' AND NOT needs_review)`).Scan(&open); err != nil {
			return false // the pool may still be reconnecting after a restart
		}
		return open == 0
	})
	s.stopAll()
	s.check(is)
}

type soak struct {
	t               *testing.T
	c               notifierCLI
	pool            *pgxpool.Pool
	n               *service.Notifier
	push, sms, none *fakes.Channel

	receipts *soakReceipts // a provider's callbacks, through notifier receipts' handler

	mu                             sync.Mutex
	workers                        map[int]*process
	logs                           []*syncBuffer // every worker process's stderr, killed ones included
	kills, stops, starts, restarts int
	creates, duplicates, cancels   int
}

func (s *soak) startWorker(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers == nil {
		s.workers = map[int]*process{}
	}
	args := []string{"--log-format", "json", "work", "--worker-id", fmt.Sprintf("soak-%d-%d", i, s.starts),
		"--channel", "push=idempotent," + s.push.URL(),
		"--channel", "sms=queryable," + s.sms.URL(),
		"--channel", "none=none," + s.none.URL(),
		"--timeout", "300ms", "--lease", "2500ms", "--backoff", "100ms", "--poll", "50ms"}
	if *soakBatch > 0 {
		args = append(args, "--batch", strconv.Itoa(*soakBatch))
	}
	p := s.c.start(args...)
	s.workers[i] = p
	s.logs = append(s.logs, p.stderr)
	s.starts++
}

func (s *soak) killAndRestart(i int) {
	s.mu.Lock()
	p := s.workers[i]
	s.kills++
	s.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies too, but make it certain
	_ = p.cmd.Process.Kill()
	<-p.done
	s.startWorker(i)
}

// stopAndContinue freezes a worker for d (shorter than the lease minus the client timeout, so that a
// frozen holder is not taken over: overlap is P2's subject, not the soak's).
func (s *soak) stopAndContinue(i int, d time.Duration) {
	s.mu.Lock()
	p := s.workers[i]
	s.stops++
	s.mu.Unlock()
	if p.cmd.Process.Signal(syscall.SIGSTOP) == nil {
		time.AfterFunc(d, func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
	}
}

func (s *soak) continueAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.workers {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
}

func (s *soak) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.workers {
		if code := p.stop(syscall.SIGTERM); code != 0 {
			s.t.Errorf("worker %d exited %d on SIGTERM; stderr tail:\n%s", i, code, tail(p.stderr.String(), 2000))
		}
	}
}

func (s *soak) restartDatabase() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pgtest.Cluster().Restart(ctx, true); err != nil { // pg_ctl stop -m immediate, then start
		s.t.Fatalf("restart PostgreSQL: %v", err)
	}
	s.mu.Lock()
	s.restarts++
	s.mu.Unlock()
}

// createConcurrently submits one event several times at once, as a retrying client would.
func (s *soak) createConcurrently(user, event string, ttl time.Duration, copies int, fallback []string) {
	var wg sync.WaitGroup
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, created, _, err := s.n.Create(ctx, service.CreateRequest{UserID: user, EventKey: event, Body: "soak " + event, TTL: ttl, MaxAttempts: 3,
				Fallback: fallback})
			if err != nil {
				return // the database may be restarting: a client would retry; the checks count what exists
			}
			s.mu.Lock()
			if created {
				s.creates++
			} else {
				s.duplicates++
			}
			s.mu.Unlock()
		}()
	}
	wg.Wait()
}

// cancel takes an event back while workers run; an event of another user, or none, changes nothing.
func (s *soak) cancel(user, event string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.n.Cancel(ctx, user, event, "soak")
	if err != nil {
		s.t.Logf("soak: cancel %s/%s: %v", user, event, err) // the database may be restarting: the checks count what was recorded
		return
	}
	if c.Changed {
		s.mu.Lock()
		s.cancels++
		s.mu.Unlock()
	}
}

// check runs the invariant checker, adds the receipts' I9, prints the counts and requires no violation.
func (s *soak) check(is *is.I) {
	v := checkInvariants(s.t, soakEvidence{pool: s.pool, logs: s.logs,
		channels: map[string]*fakes.Channel{"push": s.push, "sms": s.sms, "none": s.none}})
	count := v.count

	// I9: a receipt is evidence, never a move of a final state. A receipt recorded as CONTRADICTS found
	// its task FAILED or SUPPRESSED, and the task still is; one recorded as UNCHANGED found it SENT, and
	// no RECEIPT attempt came after it; no task is settled by receipt twice; and a parked task has no
	// receipt (the sweep settles those).
	v.add("I9 a receipt moved a final state", int(count(`SELECT count(*) FROM delivery_receipt r
		JOIN delivery_task t ON t.id = r.task_id
		WHERE (r.effect = 'CONTRADICTS' AND t.state NOT IN ('FAILED', 'SUPPRESSED'))
		   OR (r.effect = 'UNCHANGED' AND (t.state <> 'SENT' OR EXISTS (SELECT FROM delivery_attempt a
		       WHERE a.task_id = t.id AND a.action = 'RECEIPT' AND a.finished_at > r.received_at)))`)))
	v.add("I9 a task settled by receipt twice", int(count(`SELECT count(*) FROM (SELECT task_id FROM delivery_attempt
		WHERE action = 'RECEIPT' GROUP BY task_id HAVING count(*) > 1) d`)))
	v.add("I9 a parked task has a receipt", int(count(`SELECT count(*) FROM delivery_task t
		WHERE t.needs_review AND EXISTS (SELECT FROM delivery_receipt r WHERE r.task_id = t.id)`)))
	s.receipts.log(count)

	s.mu.Lock()
	s.t.Logf("soak counts: worker kills %d, stops %d, worker starts %d, database restarts %d, events created %d, duplicate submissions %d, cancels %d, fallback chains %d",
		s.kills, s.stops, s.starts, s.restarts, s.creates, s.duplicates, s.cancels,
		count(`SELECT count(DISTINCT notification_id) FROM delivery_task WHERE fallback_position IS NOT NULL`))
	s.mu.Unlock()
	v.log(s.t)
	is.Equal(v.total(), 0)  // every invariant holds
	is.True(v.tasks > 20)   // the soak did real work
	is.True(v.results > 20) // and checked real observations
	if pgtest.Cluster() != nil {
		is.True(s.restarts >= 1) // PostgreSQL was restarted mid-run
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// unfinished keeps the refs among refs whose task of channel kind is not final yet.
func (s *soak) unfinished(kind fakes.Kind, refs []string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT ref FROM delivery_task
		WHERE channel = $1 AND state IN ('PENDING', 'SENDING', 'UNKNOWN') AND ref = ANY ($2)`, string(kind), refs)
	if err != nil {
		return nil // the database may be restarting
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil
	}
	return out
}

// soakReceipts plays the providers' receipts: signed Standard Webhooks callbacks, posted to notifier
// receipts' handler (in this process, on the owner's pool) for messages the fakes accepted.
type soakReceipts struct {
	t    *testing.T
	srv  *httptest.Server
	key  []byte
	mu   sync.Mutex
	sent []string // event ids posted, for a repeat now and then
	ok   int      // answered 200 (recorded, or recognised as a duplicate)
}

func newSoakReceipts(t *testing.T, n *service.Notifier) *soakReceipts {
	key := []byte("soak receipts signing key, 24+")
	return &soakReceipts{t: t, key: key, srv: httptest.NewServer(receipts.NewHandler(n, receipts.Config{
		WebhookKeys: [][]byte{key}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))}
}

func (r *soakReceipts) close() { r.srv.Close() }

// send posts a receipt for ref (a task's reference): a new event, or with repeat one already posted.
func (r *soakReceipts) send(ref string, repeat bool) {
	r.mu.Lock()
	id := fmt.Sprintf("soak-evt-%d", len(r.sent))
	if repeat && len(r.sent) > 0 {
		id = r.sent[len(r.sent)/2]
	} else {
		r.sent = append(r.sent, id)
	}
	r.mu.Unlock()
	kind := []string{"message.sent", "message.delivered", "message.bounced"}[len(id)%3]
	body := fmt.Sprintf(`{"type":%q,"data":{"ref":%q}}`, kind, "ntf-"+ref)
	if repeat {
		body = fmt.Sprintf(`{"type":"message.delivered","data":{"ref":%q}}`, "ntf-"+ref) // a replay need not say the same
	}
	req, err := http.NewRequest(http.MethodPost, r.srv.URL+"/receipts/standard-webhooks", strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	ts := time.Now().Unix()
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", webhook.Sign(r.key, id, ts, []byte(body)))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		r.mu.Lock()
		r.ok++
		r.mu.Unlock()
	}
}

func (r *soakReceipts) log(count func(string, ...any) int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Logf("soak counts: receipts posted %d (answered 200: %d), recorded %d: settled %d, noted %d, unchanged %d, contradicts %d; tasks settled by receipt %d",
		len(r.sent), r.ok, count(`SELECT count(*) FROM delivery_receipt`),
		count(`SELECT count(*) FROM delivery_receipt WHERE effect = 'SETTLED'`),
		count(`SELECT count(*) FROM delivery_receipt WHERE effect = 'NOTED'`),
		count(`SELECT count(*) FROM delivery_receipt WHERE effect = 'UNCHANGED'`),
		count(`SELECT count(*) FROM delivery_receipt WHERE effect = 'CONTRADICTS'`),
		count(`SELECT count(*) FROM delivery_attempt WHERE action = 'RECEIPT'`))
}
