package cli

import (
	"context"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/notifierhq/notifier/service/delivery"
)

// The binary through PgBouncer in transaction mode (Debian's pgbouncer: 1.18 on bookworm, which keeps no
// prepared statements per client in that mode), in front of the test cluster, with the pgbouncer.ini
// lines, the role setting and the URL docs/operations.md#pgbouncer-and-prepared-statements gives.

// requirePgBouncer skips the test when pgbouncer is not installed, and fails it instead when
// NOTIFIER_REQUIRE_PGBOUNCER is set (.ci/run sets it and installs pgbouncer first).
func requirePgBouncer(t *testing.T) {
	t.Helper()
	if pgtest.FindPgBouncer() != "" {
		return
	}
	const why = "pgbouncer is not installed, so the tests through PgBouncer cannot run: install it as root with " +
		"sh internal/tools/install-debs pgbouncer (sh internal/tools/just test tries to)"
	if os.Getenv("NOTIFIER_REQUIRE_PGBOUNCER") != "" {
		t.Fatal(why + "; NOTIFIER_REQUIRE_PGBOUNCER is set: failing instead of skipping")
	}
	t.Skip(why)
}

// docsPgBouncerSettings returns the [pgbouncer] lines of the pgbouncer.ini block in docs/operations.md's
// "PgBouncer and prepared statements": the tests run exactly what the docs tell users to set.
func docsPgBouncerSettings(t *testing.T) []string {
	t.Helper()
	root, err := pgtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## PgBouncer and prepared statements\n")
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, found := strings.Cut(section, "```ini\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !found || !closed {
		t.Fatal("docs/operations.md: no ```ini block under ## PgBouncer and prepared statements")
	}
	var lines []string
	inSection := false
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, ";") || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			inSection = line == "[pgbouncer]"
		case inSection:
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		t.Fatal("docs/operations.md: the pgbouncer.ini block has no [pgbouncer] settings")
	}
	return lines
}

// withoutSetting is lines less the one that sets name, which must be there.
func withoutSetting(t *testing.T, lines []string, name string) []string {
	t.Helper()
	var out []string
	for _, line := range lines {
		if key, _, _ := strings.Cut(line, "="); strings.TrimSpace(key) != name {
			out = append(out, line)
		}
	}
	if len(out) == len(lines) {
		t.Fatalf("the docs' pgbouncer.ini does not set %s", name)
	}
	return out
}

// login is a login role of the test's (newLogin).
type login struct{ name, password string }

func newLoginOf(t *testing.T, pool *pgxpool.Pool, group string) login {
	name, password := newLogin(t, pool, group)
	return login{name, password}
}

// startBouncer starts a PgBouncer in front of c's database with settings, for the given logins.
func startBouncer(t *testing.T, c notifierCLI, settings []string, logins ...login) *pgtest.PgBouncer {
	t.Helper()
	users := map[string]string{}
	for _, l := range logins {
		users[l.name] = l.password
	}
	b := pgtest.StartPgBouncer(t, pgtest.PgBouncerConfig{Server: c.dbURL, Users: users, Settings: settings})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", tail(b.Log(), 4000))
		}
	})
	return b
}

// through is c connecting through b as l, with the URL parameters params.
func (c notifierCLI) through(b *pgtest.PgBouncer, l login, params ...string) notifierCLI {
	c.dbURL = b.URL(l.name, l.password, params...)
	return c
}

// execMode is the URL parameter the docs give for a pooler that keeps no prepared statements per client.
const execMode = "default_query_exec_mode=exec"

// runAll runs the command lines at once, each to exit 0, and returns their results in order.
func (c notifierCLI) runAll(lines [][]string) []result {
	c.t.Helper()
	results := make([]result, len(lines))
	errs := make([]error, len(lines))
	var wg sync.WaitGroup
	for i, args := range lines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.runErr("", args...)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if errs[i] != nil {
			c.t.Fatal(errs[i])
		}
		if r.code != 0 {
			c.t.Fatalf("notifier %s: want exit 0, got %s", strings.Join(lines[i], " "), r)
		}
	}
	return results
}

// TestThroughPgBouncerTransactionMode: every command a deployment runs through PgBouncer works there and
// keeps the seed's guarantees: preferences, concurrent creates (exactly one created=true), create
// --jsonl, work --once,
// three streaming workers (claims of several tasks, grouped finishes) that deliver every task once with
// one attempt row per request on the wire, the uncertain paths (resend with the same key, query, park),
// then review, resolve and status. PgBouncer has fewer server connections than the workers have
// clients: transaction pooling shares them.
func TestThroughPgBouncerTransactionMode(t *testing.T) {
	requirePgBouncer(t)
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	c, pool := newCLI(t)
	creator := newLoginOf(t, pool, service.RoleCreator)
	worker := newLoginOf(t, pool, service.RoleWorker)
	operator := newLoginOf(t, pool, service.RoleOperator)
	// As the docs say: on the worker's login role (a group role's setting would not reach it).
	_, err := pool.Exec(ctx, `ALTER ROLE `+pgx.Identifier{worker.name}.Sanitize()+` SET plan_cache_mode = force_generic_plan`)
	is.NoErr(err)
	const serverConns = 2
	b := startBouncer(t, c, append(docsPgBouncerSettings(t), "default_pool_size = "+strconv.Itoa(serverConns)), creator, worker, operator)
	t.Logf("%s in front of PostgreSQL; pgbouncer.ini:\n%s", b.Version(), b.Config())
	asCreator, asWorker, asOperator := c.through(b, creator, execMode), c.through(b, worker, execMode), c.through(b, operator, execMode)
	push, sms, none := startFake(t, fakes.Push), startFake(t, fakes.SMS), startFake(t, fakes.None)

	var prefs [][]string
	for u := 1; u <= 6; u++ {
		for _, ch := range []string{"push", "sms"} {
			prefs = append(prefs, []string{"pref", "set", "--user", "u" + strconv.Itoa(u), "--channel", ch, "--address", "addr-" + ch})
		}
	}
	prefs = append(prefs, []string{"pref", "set", "--user", "u7", "--channel", "none", "--address", "addr-none"},
		[]string{"pref", "set", "--user", "u8", "--channel", "push", "--address", "addr-push"})
	asCreator.runAll(prefs)

	// work --once: one cycle, one JSON result.
	var once createOutput
	decode(t, asCreator.ok("create", "--user", "u8", "--event-key", "once-1", "--body", "b").stdout, &once)
	is.Equal(len(once.Tasks), 1) // one push task
	var res service.Result
	decode(t, asWorker.ok("work", "--once", "--worker-id", "w-once", "--channel", "push=idempotent,"+push.URL()).stdout, &res)
	is.Equal(res.Kind, service.ResultSent)          // delivered through PgBouncer
	is.Equal(res.TaskID, once.Tasks[0].TaskID)      // the task just created
	is.Equal(res.Outcome, delivery.OutcomeAccepted) // accepted
	r := asWorker.ok("work", "--once", "--channel", "push=idempotent,"+push.URL())
	is.Equal(strings.TrimSpace(r.stdout), `{"result":"NOTHING"}`) // nothing left on push

	// N1 through the pooler: 8 concurrent creates of one (user, event), then distinct events at once.
	var same [][]string
	for range 8 {
		same = append(same, []string{"create", "--user", "u1", "--event-key", "order-1", "--body", "shipped"})
	}
	created := 0
	var first createOutput
	for _, r := range asCreator.runAll(same) {
		var out createOutput
		decode(t, r.stdout, &out)
		if out.Created {
			created++
			first = out
		}
	}
	is.Equal(created, 1) // exactly one created=true
	var n1 int
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM notification WHERE user_id = 'u1' AND event_key = 'order-1'`).Scan(&n1))
	is.Equal(n1, 1)               // one notification row
	is.Equal(len(first.Tasks), 2) // push and sms
	var distinct [][]string
	for u := 1; u <= 5; u++ {
		for _, ev := range []string{"order-2", "order-3"} {
			distinct = append(distinct, []string{"create", "--user", "u" + strconv.Itoa(u), "--event-key", ev, "--body", "b"})
		}
	}
	distinct = append(distinct, []string{"create", "--user", "u6", "--event-key", "slow", "--body", "b"},
		[]string{"create", "--user", "u7", "--event-key", "slow", "--body", "b"})
	for _, r := range asCreator.runAll(distinct) {
		var out createOutput
		decode(t, r.stdout, &out)
		is.True(out.Created) // each distinct event creates
	}

	// create --jsonl: batched transactions of array statements; order-1 exists already.
	var jsonl []string
	for _, key := range []string{"order-1", "order-4", "order-5", "order-6"} {
		jsonl = append(jsonl, event("u1", key, "b"))
	}
	r = asCreator.run(strings.Join(jsonl, "\n")+"\n", "create", "--jsonl", "-", "--batch-size", "2")
	is.Equal(r.code, 0) // every line submitted
	var createdJSONL []bool
	for _, l := range parseJSONL(t, r.stdout) {
		createdJSONL = append(createdJSONL, l.Created)
	}
	is.Equal(createdJSONL, []bool{false, true, true, true}) // one result per line, in order: the repeat creates nothing

	// The uncertain paths: each first call is accepted but answered after the client timeout.
	slow := map[string]string{} // ref -> channel
	for _, user := range []string{"u6", "u7"} {
		rows, err := pool.Query(ctx, `SELECT t.ref, t.channel FROM delivery_task t JOIN notification n ON n.id = t.notification_id
			WHERE n.user_id = $1`, user)
		is.NoErr(err)
		for rows.Next() {
			var ref, channel string
			is.NoErr(rows.Scan(&ref, &channel))
			slow[ref] = channel
		}
		is.NoErr(rows.Err())
	}
	is.Equal(len(slow), 3) // u6's push and sms, u7's none
	fakeOf := map[string]*fakes.Channel{"push": push, "sms": sms, "none": none}
	for ref, channel := range slow {
		fakeOf[channel].ScriptSend(ref, fakes.Step{Delay: 1200 * time.Millisecond})
	}

	workArgs := []string{"work", "--channel", "push=idempotent," + push.URL(), "--channel", "sms=queryable," + sms.URL(),
		"--channel", "none=none," + none.URL(), "--timeout", "300ms", "--lease", "3s", "--backoff", "100ms", "--poll", "50ms",
		"--batch", "4", "--max-in-flight", "8", "--finishers", "2"}
	var workers []*process
	for i := 1; i <= 3; i++ {
		workers = append(workers, asWorker.start(slices.Concat(workArgs, []string{"--worker-id", "w-" + strconv.Itoa(i)})...))
	}
	const tasks = 1 + 2 + 10*2 + 3*2 + 2 + 1
	testworld.Eventually(t, 60*time.Second, "every task delivered or parked", func() bool {
		var settled int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task WHERE state = 'SENT' OR (state = 'UNKNOWN' AND needs_review)`).Scan(&settled); err != nil {
			t.Fatal(err)
		}
		return settled == tasks
	})
	for _, w := range workers {
		testworld.Eventually(t, 20*time.Second, "the worker's start", func() bool { return strings.Contains(w.stderr.String(), "worker started") })
	}
	var serverSide int
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, worker.name).Scan(&serverSide))
	t.Logf("3 workers running; %d server connections of their role", serverSide)
	is.True(serverSide <= serverConns) // the workers' clients share PgBouncer's server connections
	for i, w := range workers {
		is.Equal(w.stop(syscall.SIGTERM), 0) // a clean stop
		stderr := w.stderr.String()
		is.True(!strings.Contains(stderr, "level=ERROR"))     // no failing cycle, claim or finish
		is.True(!strings.Contains(stderr, "plan_cache_mode")) // the role's setting reached the sessions
		t.Logf("worker %d recorded %d results", i+1, strings.Count(stderr, "msg=RESULT"))
	}

	rows, err := pool.Query(ctx, `SELECT t.ref, t.channel, t.state, t.needs_review, t.attempt_count,
		       array_agg(a.outcome ORDER BY a.attempt_no)
		FROM delivery_task t JOIN delivery_attempt a ON a.task_id = t.id
		GROUP BY t.id ORDER BY t.id`)
	is.NoErr(err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			ref, channel, state string
			parked              bool
			attemptCount        int
			outcomes            []string
		)
		is.NoErr(rows.Scan(&ref, &channel, &state, &parked, &attemptCount, &outcomes))
		seen++
		f := fakeOf[channel]
		want, wantState := []string{"ACCEPTED"}, "SENT"
		if _, ok := slow[ref]; ok {
			want = map[string][]string{"push": {"TIMEOUT", "ACCEPTED_REPLAY"}, "sms": {"TIMEOUT", "QUERY_FOUND"}, "none": {"TIMEOUT"}}[channel]
			if channel == "none" {
				wantState = "UNKNOWN"
			}
		}
		if strings.Join(outcomes, ",") != strings.Join(want, ",") || state != wantState || attemptCount != len(want) ||
			parked != (wantState == "UNKNOWN") {
			t.Errorf("%s task %s: %s parked=%v after %d attempts %v; want %s after %v", channel, ref, state, parked, attemptCount, outcomes, wantState, want)
		}
		if requests := f.Sends(ref) + f.Queries(ref); requests != len(outcomes) { // R3: every request has its attempt row
			t.Errorf("%s task %s: %d requests on the wire, %d attempt rows", channel, ref, requests, len(outcomes))
		}
		if f.Outbound(ref) != 1 {
			t.Errorf("%s task %s: %d messages went out, want 1", channel, ref, f.Outbound(ref))
		}
	}
	is.NoErr(rows.Err())
	is.Equal(seen, tasks) // every task has its attempts

	// The operator's commands through PgBouncer.
	var st service.Status
	decode(t, asOperator.ok("status", "--json").stdout, &st)
	is.Equal(st.Parked, int64(1)) // the none task
	lines := strings.Split(strings.TrimSpace(asOperator.ok("review").stdout), "\n")
	is.Equal(len(lines), 1) // one parked task to review
	var p service.ReviewTask
	decode(t, lines[0], &p)
	is.Equal(p.Channel, "none")                              // the none task
	is.Equal(p.Attempts[0].Outcome, delivery.OutcomeTimeout) // with its history
	id := strconv.FormatInt(p.ID, 10)
	var resolved resolveOutput
	decode(t, asOperator.ok("resolve", "--task", id, "--state", "SENT", "--note", "seen in the provider's console").stdout, &resolved)
	is.Equal(resolved, resolveOutput{TaskID: p.ID, State: delivery.StateSent, Changed: true}) // resolved once
	r = asOperator.run("", "resolve", "--task", id, "--state", "FAILED", "--note", "again")
	is.Equal(r.code, 3) // the second resolve changes nothing
	decode(t, asOperator.ok("status", "--json").stdout, &st)
	is.Equal(st.Parked, int64(0)) // nothing parked any more
	total := int64(0)
	for _, sc := range st.Counts {
		is.Equal(sc.State, delivery.StateSent) // every task SENT
		total += sc.Tasks
	}
	is.Equal(total, int64(tasks))
}

// TestThroughPgBouncerSessionMode: in session mode a client keeps its server connection, and with it
// its prepared statements: the default URL works, with only ignore_startup_parameters and the role's
// plan_cache_mode, and the worker's claim (BEGIN and COMMIT in the batches of its two statements) and
// finish go through PgBouncer, one call at a time.
func TestThroughPgBouncerSessionMode(t *testing.T) {
	requirePgBouncer(t)
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	c, pool := newCLI(t)
	creator, worker := newLoginOf(t, pool, service.RoleCreator), newLoginOf(t, pool, service.RoleWorker)
	_, err := pool.Exec(ctx, `ALTER ROLE `+pgx.Identifier{worker.name}.Sanitize()+` SET plan_cache_mode = force_generic_plan`)
	is.NoErr(err)
	settings := append(withoutSetting(t, docsPgBouncerSettings(t), "pool_mode"), "pool_mode = session", "default_pool_size = 8")
	b := startBouncer(t, c, settings, creator, worker)
	push := startFake(t, fakes.Push)
	asCreator := c.through(b, creator)
	asCreator.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	const tasks = 24
	var creates [][]string
	for i := range tasks {
		creates = append(creates, []string{"create", "--user", "u1", "--event-key", "order-" + strconv.Itoa(i), "--body", "b"})
	}
	asCreator.runAll(creates)
	var workers []*process
	for i := 1; i <= 2; i++ {
		workers = append(workers, c.through(b, worker).start("work", "--worker-id", "w-"+strconv.Itoa(i), "--channel", "push=idempotent,"+push.URL(),
			"--batch", "1", "--max-in-flight", "1", "--poll", "50ms"))
	}
	testworld.Eventually(t, 60*time.Second, "every task delivered", func() bool {
		var sent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task WHERE state = 'SENT'`).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		return sent == tasks
	})
	for _, w := range workers {
		is.Equal(w.stop(syscall.SIGTERM), 0)                         // a clean stop
		is.True(!strings.Contains(w.stderr.String(), "level=ERROR")) // nothing failed
		is.True(!strings.Contains(w.stderr.String(), "level=WARN"))  // nor was worth a warning
	}
	var attempts, maxAttempts int
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*), max(attempt_count) FROM delivery_attempt a JOIN delivery_task t ON t.id = a.task_id`).
		Scan(&attempts, &maxAttempts))
	is.Equal(attempts, tasks)             // one attempt per task
	is.Equal(maxAttempts, 1)              // each the first
	is.Equal(push.TotalOutbound(), tasks) // one message each
	is.Equal(push.MaxOutboundPerRef(), 1)
}

// TestThroughPgBouncerRefusals: what the docs warn against fails at once, writes nothing, and says the
// fix: PgBouncer without ignore_startup_parameters refuses the worker's plan_cache_mode; without
// default_query_exec_mode=exec the statements prepared by one client collide with another's on a
// shared server connection; a worker whose statements are dropped under it stops instead of retrying;
// a worker whose login role lacks the plan_cache_mode setting says so.
func TestThroughPgBouncerRefusals(t *testing.T) {
	requirePgBouncer(t)
	t.Parallel()
	ctx := context.Background()
	c, pool := newCLI(t)
	creator := newLoginOf(t, pool, service.RoleCreator)
	worker := newLoginOf(t, pool, service.RoleWorker) // no plan_cache_mode of its own
	push := startFake(t, fakes.Push)
	n := service.NewNotifier(pool)
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err)
	_, _, due, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "due-1", Body: "b", TTL: time.Hour, MaxAttempts: 3})
	is.New(t).NoErr(err) // one due push task
	// One server connection per role: every client of a role shares it.
	docs := append(docsPgBouncerSettings(t), "default_pool_size = 1")
	pushChannel := "push=idempotent," + push.URL()

	t.Run("without ignore_startup_parameters", func(t *testing.T) {
		b := startBouncer(t, c, withoutSetting(t, docs, "ignore_startup_parameters"), creator, worker)
		for _, args := range [][]string{{"work", "--once", "--channel", pushChannel}, {"work", "--channel", pushChannel}} {
			is := is.New(t)
			r := c.through(b, worker, execMode).run("", args...)
			is.Equal(r.code, 1)                                                                                          // refused
			oneErrorLine(t, r)                                                                                           // on one line, at once: a refusal is not waited out (--wait-for-database)
			is.True(strings.Contains(r.stderr, "unsupported startup parameter: plan_cache_mode"))                        // PgBouncer's words
			is.True(strings.Contains(r.stderr, "add plan_cache_mode to its ignore_startup_parameters"))                  // the fix
			is.True(strings.Contains(r.stderr, `ALTER ROLE "`+worker.name+`" SET plan_cache_mode = force_generic_plan`)) // and the role setting
			is.True(!strings.Contains(r.stderr, "database unreachable"))                                                 // not an outage
		}
		is := is.New(t)
		is.Equal(push.TotalSends(), 0) // nothing called
		task, err := n.Task(ctx, due[0].TaskID)
		is.NoErr(err)
		is.Equal(task.State, delivery.StatePending) // nothing claimed
	})

	b := startBouncer(t, c, docs, creator, worker)
	t.Run("without default_query_exec_mode=exec", func(t *testing.T) {
		is := is.New(t)
		plain := c.through(b, creator)
		plain.ok("create", "--user", "u1", "--event-key", "e-1", "--body", "b") // the first client's statements stay on the server connection
		before := rowCounts(t, pool)
		r := plain.run("", "create", "--user", "u1", "--event-key", "e-2", "--body", "b")
		is.Equal(r.code, 1) // the next client's collide with them
		oneErrorLine(t, r)
		is.True(strings.Contains(r.stderr, "(SQLSTATE 42P05)"))                                           // prepared statement already exists
		is.True(strings.Contains(r.stderr, "add default_query_exec_mode=exec to the database URL"))       // the fix
		is.Equal(rowCounts(t, pool), before)                                                              // nothing written
		c.through(b, creator, execMode).ok("create", "--user", "u1", "--event-key", "e-2", "--body", "b") // the fix works
	})

	t.Run("role without plan_cache_mode", func(t *testing.T) {
		is := is.New(t)
		r := c.through(b, worker, execMode).ok("work", "--once", "--channel", pushChannel)
		is.True(strings.Contains(r.stdout, `"result":"SENT"`))                                                         // it works
		is.True(strings.Contains(r.stderr, "plan_cache_mode = auto, not force_generic_plan"))                          // and says what it lacks
		is.True(strings.Contains(r.stderr, `ALTER ROLE \"`+worker.name+`\" SET plan_cache_mode = force_generic_plan`)) // and how to fix it (quoted in the log line)
	})

	t.Run("statements dropped under a running worker", func(t *testing.T) {
		is := is.New(t)
		// Served channel sms has no task: the worker only claims, every --poll.
		w := c.through(b, worker).start("work", "--channel", "sms=queryable,"+push.URL(), "--poll", "50ms")
		testworld.Eventually(t, 20*time.Second, "the worker's start", func() bool { return strings.Contains(w.stderr.String(), "worker started") })
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, b.URL(worker.name, worker.password, execMode))
		is.NoErr(err)
		defer conn.Close(context.Background())
		// What a pooler that resets its server connections does (server_reset_query_always, DISCARD ALL),
		// on the one server connection the worker's clients share; the worker claims every --poll.
		for exited := false; !exited; {
			_, err := conn.Exec(ctx, "DEALLOCATE ALL")
			if ctx.Err() != nil {
				t.Fatalf("the worker still runs with its statements dropped; stderr:\n%s", w.stderr)
			}
			is.NoErr(err)
			select {
			case <-w.done:
				exited = true
			case <-time.After(100 * time.Millisecond):
			}
		}
		is.Equal(w.cmd.ProcessState.ExitCode(), 1) // it stops
		stderr := w.stderr.String()
		is.True(strings.Contains(stderr, "stopping: the connection pooler's configuration breaks the worker's statements")) // at once
		is.True(strings.Contains(stderr, "add default_query_exec_mode=exec to the database URL"))                           // naming the fix
		is.True(strings.HasPrefix(stderr[strings.LastIndex(strings.TrimSuffix(stderr, "\n"), "\n")+1:], "notifier: "))      // and its error line is last
	})
}
