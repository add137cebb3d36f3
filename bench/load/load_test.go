package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/bench/latency"
	"github.com/notifierhq/notifier/bench/pgbench"
	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// runBench runs the bench's command line in this process on a fresh database and decodes its one JSON
// object.
func runBench(t *testing.T, args ...string) (Report, map[string]any) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"--json", "--database-url", pgtest.NewDBURL(t)}, args...)
	if err := Main(ctx, args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench %s: %v\nstdout: %s\nstderr: %s", strings.Join(args[3:], " "), err, stdout.String(), stderr.String())
	}
	if n := strings.Count(strings.TrimSpace(stdout.String()), "\n"); n != 0 {
		t.Fatalf("want one JSON line on stdout, got %q", stdout.String())
	}
	var got Report
	var keys map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("decode %q: %v", stdout.String(), err)
	}
	if err := json.Unmarshal(stdout.Bytes(), &keys); err != nil {
		t.Fatal(err)
	}
	return got, keys
}

// checkReport checks what every report must show.
func checkReport(t *testing.T, got Report, keys map[string]any, notifications int) {
	t.Helper()
	is := is.NewRelaxed(t)
	is.Helper()
	for _, k := range []string{"peer", "notifications", "tasks", "workers", "max_in_flight", "batch", "finishers", "window",
		"call_latency", "pool_max_conns", "server", "create_calls", "created", "creates_per_sec", "deliveries",
		"deliveries_per_sec", "claims", "tasks_per_claim", "finishes", "answers_per_finish",
		"claim_ms", "finish_ms", "call_ms", "create_to_sent_ms", "db_xacts_per_delivery", "cpu_ms_per_delivery",
		"peak_rss_mib", "sends", "outbound", "autovacuums", "check"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("field %q missing", k)
		}
	}
	is.Equal(got.Check, "ok")                                                  // every task SENT, one notification per event, each message once
	is.Equal(got.Peer, "notifier")                                             // which side
	is.Equal(got.Notifications, notifications)                                 // as asked
	is.Equal(got.Created, notifications)                                       // each event created once (R1)
	is.Equal(got.CreateCalls, notifications+notifications/10)                  // --duplicates 0.1 by default
	is.Equal(got.DuplicateAnswers, notifications/10)                           // the repeats answered created=false
	is.Equal(got.Tasks, 2*notifications)                                       // push and sms per notification
	is.Equal(got.Deliveries, got.Tasks)                                        // every task of the main run SENT
	is.Equal(got.Window, got.Workers*got.MaxInFlight)                          // the calls in flight at most
	is.True(got.CreatesPerSec > 0 && got.DeliveriesPerSec > 0)                 // rates measured
	is.True(got.Claims >= 1 && got.ClaimMS.P50 > 0)                            // claims timed through the loop's hooks
	is.True(got.ClaimMS.P99 >= got.ClaimMS.P50)                                // percentiles ordered
	is.True(got.Finishes >= 1 && got.FinishMS.P50 > 0)                         // finishes timed too
	is.True(got.TasksPerClaim >= 1 && got.TasksPerClaim <= float64(got.Batch)) // a claim takes at most --batch
	is.True(got.AnswersPerFinish >= 1)                                         // a finish records at least one answer
	is.True(got.CreateToSentMS.P50 > 0)                                        // create -> SENT measured
	is.True(got.DBXactsPerDelivery > 0 && got.DBXactsPerDelivery < 4)          // xact_commit delta sane
	is.True(got.PeakRSSMiB > 1 && got.PeakRSSMiB < 4096)                       // VmHWM read
	is.True(got.Server.Fsync != "" && got.Server.SynchronousCommit != "")      // settings reported
	is.Equal(got.Server.PlanCacheMode, service.WorkerPlanCacheMode)            // the workers' connections plan once
	is.Equal(got.PoolMaxConns >= got.Workers*got.WorkerPoolConns, true)        // a pool per loop
	if got.ServerCPUSkipped == "" {
		is.True(got.ServerCPUMSPerDelivery > 0) // the server's CPU per delivery, from /proc
	} else {
		t.Logf("server CPU not measured: %s", got.ServerCPUSkipped)
	}
}

// The latency model and refused sends, through the real worker loop: every task is SENT once, the
// refused sends were retried, and the calls took the model's time.
func TestBenchLatencyModelWithErrors(t *testing.T) {
	got, keys := runBench(t, "--notifications", "150", "--warmup", "0", "--workers", "2", "--max-in-flight", "16",
		"--batch", "8", "--call-latency", "5ms,0.5", "--call-errors", "0.1", "--seed", "7", "--pgbench=false")
	checkReport(t, got, keys, 150)
	is := is.New(t)
	is.Equal(got.CallLatency.Spec, "5ms,0.5")                         // the model, reported
	is.Equal(got.CallLatency.Seed, uint64(7))                         // with its seed
	is.Equal(got.CallLatency.Errors, 0.1)                             // and its errors
	is.True(got.CallLatency.P99MS > 15 && got.CallLatency.P99MS < 17) // 5ms x exp(0.5 x 2.326)
	is.True(got.OtherResults["PENDING"] > 0)                          // refused sends came back PENDING, to retry
	is.True(got.Sends > got.Outbound)                                 // so more sends than messages
	is.Equal(got.Outbound, got.Deliveries)                            // yet one message per task
	is.True(got.CallMS.P99 >= 5)                                      // the calls took the model's time
	is.True(got.CallMS.P50 > 2)                                       // (the median's 5 ms, less the refused ones)
	is.Equal(got.Workers, 2)                                          // as asked
	is.Equal(got.MaxInFlight, 16)                                     // as asked
	is.Equal(got.Window, 32)                                          // 2 loops x 16 calls
	is.Equal(got.WorkerPoolConns, 3)                                  // 1 + 2 finishers per loop
	is.Equal(got.PgbenchSkipped, "--pgbench=false")                   // says why not
}

// The deliver phase meets the latency model's answers from the first draw of each channel's stream,
// as the River peer's one phase does, not from where the warm-up left them; and the report gives the
// window's bound over those answers.
func TestBenchDeliverPhaseDrawsFromTheStart(t *testing.T) {
	got, keys := runBench(t, "--notifications", "100", "--warmup", "60", "--max-in-flight", "8", "--batch", "8",
		"--call-latency", "2ms,0.5", "--pgbench=false")
	checkReport(t, got, keys, 100)
	is := is.New(t)
	is.Equal(got.WarmupDeliveries, 120) // the warm-up drew 120 answers first
	is.Equal(got.CallSteps, 200)        // yet the phase drew its 200 from new samplers
	m := latency.Model{Median: 2 * time.Millisecond, Sigma: 0.5, Seed: 1}
	is.Equal(got.WindowBoundPerSec, math.Round(latency.WindowBound(m.FirstDelays(2, 100), 8))) // the first 100 answers of each channel, 8 slots
	is.True(got.WindowBoundPerSec > got.DeliveriesPerSec)                                      // no worker reaches it
}

// --skip-calls per task: the database side alone, the configuration the per-task ratio to pgbench is
// measured in; with pgbench (when found) and the claim latency against history.
func TestBenchSkipCallsPerTask(t *testing.T) {
	got, keys := runBench(t, "--notifications", "200", "--warmup", "50", "--workers", "4", "--max-in-flight", "1",
		"--batch", "1", "--finishers", "1", "--skip-calls", "--history", "2000", "--probe", "100")
	checkReport(t, got, keys, 200)
	is := is.New(t)
	is.True(got.SkipCalls)                                               // reported
	is.Equal(got.Sends, 0)                                               // the fakes were never called
	is.Equal(got.WarmupDeliveries, 100)                                  // --warmup 50: push and sms each, before the figures
	is.Equal(got.TasksPerClaim, 1.0)                                     // per task
	is.True(got.DBXactsPerDelivery >= 1.9 && got.DBXactsPerDelivery < 3) // a claim and a finish transaction per delivery
	is.True(got.CallMS.P50 < 1)                                          // the instant client answers at once
	h := got.History
	is.True(h != nil)                                             // --history measured
	is.Equal(h.Rows, 2000)                                        // finished tasks added
	is.Equal(h.Before.Tasks, 200)                                 // a probe of 100 notifications
	is.Equal(h.After.Tasks, 200)                                  // and another of the same size
	is.True(h.After.FinishedTasks >= h.Before.FinishedTasks+2000) // the history was there
	is.True(h.Before.ClaimMS.P50 > 0 && h.After.ClaimMS.P50 > 0)  // both probes measured
	is.Equal(h.Before.SeedRuns, seedRuns)                         // the seed claim
	is.Equal(h.Before.SeedFound, seedRuns)                        // found a due task each time
	is.Equal(h.After.SeedFound, seedRuns)                         // also behind the history
	if got.Pgbench == nil {
		t.Logf("pgbench not found: %s", got.PgbenchSkipped)
		is.True(got.PgbenchSkipped != "") // says why not
		return
	}
	g := got.Pgbench
	is.True(g.TPS > 0)                        // pgbench ran
	is.Equal(g.Clients, 4)                    // one client per worker loop
	is.True(g.Transactions >= got.Deliveries) // for as many deliveries
	is.True(g.GoVsPgbench > 0)                // the ratio
	is.True(g.ClientCPUMSPerDelivery > 0)     // pgbench's own CPU
}

// --rounds alternates deliver phases and pgbench runs and reports each ratio and their median.
func TestBenchRounds(t *testing.T) {
	if _, err := pgbench.FindBin(os.Getenv); err != nil {
		t.Skipf("pgbench not found: %v", err)
	}
	got, keys := runBench(t, "--notifications", "100", "--warmup", "0", "--workers", "2", "--max-in-flight", "1",
		"--batch", "1", "--rounds", "2")
	checkReport(t, got, keys, 100)
	is := is.New(t)
	is.True(got.Pgbench != nil)                                  // pgbench ran
	is.Equal(len(got.Rounds), 2)                                 // the main pair and one more
	is.Equal(got.Rounds[0].GoVsPgbench, got.Pgbench.GoVsPgbench) // the first is the main run's
	for _, r := range got.Rounds {
		is.Equal(r.Deliveries, 200)                         // 100 notifications x 2 channels each round
		is.True(r.DeliveriesPerSec > 0 && r.PgbenchTPS > 0) // both sides measured
	}
	lo, hi := min(got.Rounds[0].GoVsPgbench, got.Rounds[1].GoVsPgbench), max(got.Rounds[0].GoVsPgbench, got.Rounds[1].GoVsPgbench)
	is.True(got.MedianGoVsPgbench >= lo-0.001 && got.MedianGoVsPgbench <= hi+0.001) // the median of two lies between them
	is.Equal(got.Outbound, 2*200)                                                   // every round's tasks sent once, in the final check
}

func TestBenchRefusesBadFlags(t *testing.T) {
	env := func(string) string { return "postgres://127.0.0.1:1/none" }
	for _, args := range [][]string{
		{"--workers", "0"},
		{"--workers", "65"},
		{"--max-in-flight", "0"},
		{"--batch", "0"},
		{"--finishers", "0"},
		{"--finish-delay", "0s"},
		{"--finish-delay", "2s"},
		{"--finish-apart"}, // gone with the finish carried ahead of the claim
		{"--duplicates", "-1"},
		{"--notifications", "0"},
		{"--warmup", "-1"},
		{"--rounds", "0"},
		{"--rounds", "21"},
		{"--rounds", "2", "--pgbench=false"},
		{"--call-latency", "100ms,9"},
		{"--call-latency", "fast"},
		{"--call-errors", "0.9"},
		{"--skip-calls", "--call-latency", "100ms,0.8"},
		{"--pipeline"}, // gone: the worker loop decides
		{"extra"},
	} {
		var stderr bytes.Buffer
		err := Main(context.Background(), args, env, &bytes.Buffer{}, &stderr)
		var usage *UsageError
		if !errors.As(err, &usage) {
			t.Errorf("bench %s: want a usage error, got %v", strings.Join(args, " "), err)
		}
	}
	var usage *UsageError
	err := Main(context.Background(), nil, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("no database: want a usage error naming DATABASE_URL, got %v", err)
	}
}

// A malformed database URL is refused without its password: pgx's own error quotes the string with a
// redaction that shows part of a malformed one.
func TestBenchBadDatabaseURLHidesPassword(t *testing.T) {
	for _, tc := range []struct {
		url    string
		pieces []string // no piece of the password may show
	}{
		{"postgres://u:secret@127.0.0.1:1/x?sslmode=sometimes", []string{"secret"}},
		{"postgres://u:pa ss@127.0.0.1:1/x", []string{"pa ss", "ss@"}},
		{"host=127.0.0.1 user=u password='abc def dbname=x", []string{"abc", "def"}},
		{`host=127.0.0.1 password=abc\ def sslmode=bogus`, []string{"abc", "def"}},
	} {
		err := Main(context.Background(), []string{"--database-url", tc.url}, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
		var usage *UsageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), "invalid database URL") {
			t.Errorf("%s: want a usage error about the URL, got %v", tc.url, err)
			continue
		}
		for _, p := range tc.pieces {
			if strings.Contains(err.Error(), p) {
				t.Errorf("%s: the error shows %q of the password: %v", tc.url, p, err)
			}
		}
	}
}

// The final check catches what it claims to: a task not SENT, and a message accepted twice for one
// task (negative controls, on a bench whose run did not deliver).
func TestFinalCheckCatchesFailures(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDBURL(t))
	is.NoErr(err)
	defer pool.Close()
	push, sms := fakes.Start(fakes.Push), fakes.Start(fakes.SMS)
	defer push.Close()
	defer sms.Close()
	b := &bench{cfg: Config{DBTimeout: 10 * time.Second}, pool: pool, q: dbgen.New(pool), n: service.NewNotifier(pool),
		push: push, sms: sms, run: "check-run"}
	user := b.run + "-u0"
	for _, ch := range []string{"push", "sms"} {
		_, err := b.n.SetPreference(ctx, user, ch, user+"@"+ch, true)
		is.NoErr(err)
	}
	_, created, tasks, err := b.n.Create(ctx, service.CreateRequest{UserID: user, EventKey: "e1", Body: "hello", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)
	is.True(created && len(tasks) == 2) // two tasks, never delivered

	var rep Report
	err = b.finalCheck(ctx, &rep)
	is.True(err != nil && strings.Contains(err.Error(), "2 of 2 tasks not SENT")) // caught

	b.delivered = 2
	// As if delivered, behind the state machine's back (schema/003 refuses a SENT without its attempt).
	_, err = pool.Exec(ctx, `ALTER TABLE delivery_task DISABLE TRIGGER USER;
		UPDATE delivery_task SET state = 'SENT', next_attempt_at = NULL, provider_msg_id = 'x';
		ALTER TABLE delivery_task ENABLE TRIGGER USER`)
	is.NoErr(err)
	for range 2 { // the sms fake accepts the same task's message twice
		resp, err := http.Post(sms.URL()+"/send", "application/json", strings.NewReader(`{"ref":"task-1","to":"a","body":"b"}`))
		is.NoErr(err)
		resp.Body.Close()
	}
	err = b.finalCheck(ctx, &rep)
	is.True(err != nil && strings.Contains(err.Error(), "sent 2 times")) // caught
	is.Equal(rep.Outbound, 2)                                            // both counted
}

// --phase-hook marks the main deliver phase alone (bench/cost-vs-river.sh counts the server's work
// between the marks): at "start" every task of the run is created and none of the main run's is
// delivered (the warm-up's are, and the warm-up is not marked), at "end" all are SENT. A failing hook
// fails the run.
func TestBenchPhaseHookBracketsTheDeliverPhase(t *testing.T) {
	is := is.New(t)
	url := pgtest.NewDBURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := Parse([]string{"--json", "--database-url", url, "--notifications", "50", "--warmup", "20",
		"--pgbench=false", "--phase-hook", "true"}, func(string) string { return "" }, io.Discard)
	is.NoErr(err)
	is.True(cfg.PhaseHook != nil) // the flag sets the hook (workload.ShellHook)
	pool, err := pgxpool.New(ctx, url)
	is.NoErr(err)
	defer pool.Close()
	var marks []string
	cfg.PhaseHook = func(ctx context.Context, phase string) error {
		var sent, notSent int
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'SENT'), count(*) FILTER (WHERE state <> 'SENT')
			FROM delivery_task`).Scan(&sent, &notSent)
		marks = append(marks, fmt.Sprintf("%s: %d SENT, %d not", phase, sent, notSent))
		return err
	}
	is.NoErr(Run(ctx, cfg, &bytes.Buffer{}, io.Discard))
	is.Equal(marks, []string{"start: 40 SENT, 100 not", "end: 140 SENT, 0 not"}) // warm-up 20 x 2 before; main 50 x 2

	cfg.DBURL = pgtest.NewDBURL(t)
	cfg.Notifications, cfg.Warmup = 10, 0
	cfg.PhaseHook = func(_ context.Context, phase string) error { return fmt.Errorf("hook refused %s", phase) }
	err = Run(ctx, cfg, &bytes.Buffer{}, io.Discard)
	is.True(err != nil && strings.Contains(err.Error(), "hook refused start")) // the run stops
}
