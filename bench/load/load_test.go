package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// benchJSON is the part of `notifier bench --json` the tests check.
type benchJSON struct {
	Notifications      int            `json:"notifications"`
	Tasks              int            `json:"tasks"`
	Workers            int            `json:"workers"`
	Batch              int            `json:"batch"`
	CreateCalls        int            `json:"create_calls"`
	Created            int            `json:"created"`
	DuplicateAnswers   int            `json:"duplicate_answers"`
	CreatesPerSec      float64        `json:"creates_per_sec"`
	WarmupDeliveries   int            `json:"warmup_deliveries"`
	Deliveries         int            `json:"deliveries"`
	DeliveriesPerSec   float64        `json:"deliveries_per_sec"`
	CreateToSentMS     latency        `json:"create_to_sent_ms"`
	ClaimMS            latency        `json:"claim_ms"`
	FinishMS           latency        `json:"finish_ms"`
	FinishThenClaimMS  latency        `json:"finish_then_claim_ms"`
	Pipeline           bool           `json:"pipeline"`
	ClaimsAlone        int            `json:"claims_alone"`
	Rounds             []roundReport  `json:"rounds"`
	MedianGoVsPgbench  float64        `json:"median_go_vs_pgbench"`
	Claims             int            `json:"claims"`
	DBXactsPerDelivery float64        `json:"db_xacts_per_delivery"`
	PeakRSSMiB         float64        `json:"peak_rss_mib"`
	ServerCPUMS        float64        `json:"server_cpu_ms_per_delivery"`
	ServerCPUSkipped   string         `json:"server_cpu_skipped"`
	Outbound           int            `json:"outbound"`
	Server             serverInfo     `json:"server"`
	History            *historyReport `json:"history"`
	Pgbench            *pgbenchReport `json:"pgbench"`
	PgbenchSkipped     string         `json:"pgbench_skipped"`
	Check              string         `json:"check"`
}

// runBenchJSON runs the built binary's bench command and decodes its one JSON object.
func runBenchJSON(t *testing.T, c notifierCLI, args ...string) (benchJSON, map[string]any) {
	t.Helper()
	r := c.ok(append([]string{"bench", "--json"}, args...)...)
	var got benchJSON
	var keys map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	if err := json.Unmarshal([]byte(r.stdout), &keys); err != nil {
		t.Fatal(err)
	}
	if strings.Count(strings.TrimSpace(r.stdout), "\n") != 0 {
		t.Fatalf("want one JSON line on stdout, got %q", r.stdout)
	}
	return got, keys
}

// checkBench checks what every bench report must show.
func checkBench(t *testing.T, got benchJSON, keys map[string]any, notifications, workers, batch int) {
	t.Helper()
	is := is.New(t)
	is.Helper()
	for _, k := range []string{"notifications", "tasks", "workers", "batch", "duplicates", "pool_max_conns", "server",
		"create_calls", "created", "duplicate_answers", "create_seconds", "creates_per_sec", "create_call_ms",
		"deliveries", "deliver_seconds", "deliveries_per_sec", "create_to_sent_ms", "claim_ms", "finish_ms",
		"finish_then_claim_ms", "pipeline", "claims_alone", "db_xacts_per_delivery", "cpu_ms_per_delivery", "peak_rss_mib", "outbound", "check"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("field %q missing", k)
		}
	}
	is.Equal(got.Check, "ok")                                          // every task SENT, one notification per event
	is.Equal(got.Notifications, notifications)                         // as asked
	is.Equal(got.Workers, workers)                                     // as asked
	is.Equal(got.Batch, batch)                                         // as asked
	is.Equal(got.Created, notifications)                               // each event created once (R1)
	is.Equal(got.CreateCalls, notifications+notifications/10)          // --duplicates 0.1 by default
	is.Equal(got.DuplicateAnswers, notifications/10)                   // the repeats answered created=false
	is.Equal(got.Tasks, 2*notifications)                               // push and sms per notification
	is.Equal(got.Deliveries, got.Tasks)                                // every task of the main run SENT
	is.True(got.CreatesPerSec > 0 && got.DeliveriesPerSec > 0)         // rates measured
	is.True(got.ClaimMS.P50 > 0 && got.ClaimMS.P99 >= got.ClaimMS.P50) // claim latency measured
	is.True(got.ClaimsAlone >= 1)                                      // a worker's first claim is alone at least
	if got.Pipeline {                                                  // finishes carried the next claim
		is.True(got.FinishThenClaimMS.P50 > 0 && got.FinishThenClaimMS.P99 >= got.FinishThenClaimMS.P50) // measured
		is.True(got.ClaimsAlone < got.Claims)                                                            // most claims rode with a finish
	} else {
		is.True(got.FinishMS.P50 > 0 && got.FinishMS.P99 >= got.FinishMS.P50) // finish latency measured
		is.Equal(got.FinishThenClaimMS.P50, 0.0)                              // no finish carried a claim
		is.Equal(got.ClaimsAlone, got.Claims)                                 // every claim went alone
	}
	is.True(got.CreateToSentMS.P50 > 0 && got.CreateToSentMS.P99 >= got.CreateToSentMS.P50)
	// Two transactions per claim-and-finish cycle, a few empty claims at the end: per task at batch 1,
	// per batch otherwise.
	perDelivery := 2.0 / float64(batch)
	is.True(got.DBXactsPerDelivery >= perDelivery*0.9 && got.DBXactsPerDelivery < perDelivery+1) // xact_commit delta sane
	is.True(got.PeakRSSMiB > 1 && got.PeakRSSMiB < 1024)                                         // VmHWM read
	is.True(got.Outbound >= got.Deliveries)                                                      // every message went out, once (checked by bench)
	is.True(got.Server.Fsync != "" && got.Server.SynchronousCommit != "")                        // settings reported
	is.Equal(got.Server.PlanCacheMode, service.WorkerPlanCacheMode)                              // the workers' connections plan once
	serverMeasured := got.ServerCPUSkipped == ""
	if serverMeasured {
		is.True(got.ServerCPUMS > 0) // the server's CPU per delivery, from /proc
	} else {
		t.Logf("server CPU not measured: %s", got.ServerCPUSkipped)
	}
	if got.Pgbench != nil {
		is.True(got.Pgbench.TPS > 0)                        // pgbench ran
		is.Equal(got.Pgbench.Clients, workers)              // as many clients as workers
		is.True(got.Pgbench.Transactions >= got.Deliveries) // for as many deliveries
		is.True(got.Pgbench.GoVsPgbench > 0)                // the ratio
		is.True(got.Pgbench.ClientCPUMSPerDelivery > 0)     // pgbench's own CPU
		if serverMeasured {
			is.True(got.Pgbench.ServerCPUMSPerDelivery > 0) // and the server's for it
		}
	} else {
		is.True(got.PgbenchSkipped != "") // says why not
	}
}

func TestBench(t *testing.T) {
	c, _ := newCLI(t)
	got, keys := runBenchJSON(t, c, "--notifications", "200", "--warmup", "50", "--workers", "4", "--pipeline=false")
	checkBench(t, got, keys, 200, 4, 1)
	is := is.New(t)
	is.True(!got.Pipeline)                                      // --pipeline=false: claims and finishes on their own
	is.Equal(got.WarmupDeliveries, 100)                         // --warmup 50: push and sms each, before the figures
	is.Equal(got.Outbound, got.Deliveries+got.WarmupDeliveries) // each sent once, warm-up included in the final check
	if got.History != nil {
		t.Errorf("history probe without --history: %+v", got.History)
	}
}

func TestBenchBatchedWithHistory(t *testing.T) {
	is := is.New(t)
	c, _ := newCLI(t)
	got, keys := runBenchJSON(t, c, "--notifications", "200", "--warmup", "0", "--workers", "4", "--batch", "8", "--history", "2000")
	checkBench(t, got, keys, 200, 4, 8)
	is.True(got.Pipeline) // by default, as notifier work does
	h := got.History
	is.True(h != nil)                                                   // --history measured
	is.Equal(h.Rows, 2000)                                              // finished tasks added
	is.Equal(h.Before.Tasks, 400)                                       // a probe of 200 notifications
	is.Equal(h.After.Tasks, 400)                                        // and another of the same size
	is.True(h.After.FinishedTasks >= h.Before.FinishedTasks+2000)       // the history was there
	is.True(h.Before.ClaimMS.P50 > 0 && h.After.ClaimMS.P50 > 0)        // both probes measured
	is.Equal(h.Before.SeedRuns, 4)                                      // the seed claim, once per worker
	is.Equal(h.Before.SeedFound, 4)                                     // and it found a due task each time
	is.Equal(h.After.SeedFound, 4)                                      // also behind the history
	is.True(h.ClaimP50Ratio > 0 && h.SeedClaimP50Ratio > 0)             // both ratios
	is.Equal(got.Outbound, got.Deliveries+h.Before.Tasks+h.After.Tasks) // every probe task sent once too
}

func TestBenchRefusesBadFlags(t *testing.T) {
	c := notifierCLI{t: t, dbURL: "postgres://127.0.0.1:1/none"}
	for _, args := range [][]string{
		{"bench", "--workers", "0"},
		{"bench", "--batch", "0"},
		{"bench", "--duplicates", "-1"},
		{"bench", "--notifications", "0"},
		{"bench", "--warmup", "-1"},
		{"bench", "--rounds", "0"},
		{"bench", "--rounds", "21"},
		{"bench", "--rounds", "2", "--pgbench=false"},
	} {
		r := c.run("", args...)
		if r.code != exitUsage {
			t.Errorf("notifier %s: want exit 2, got %s", strings.Join(args, " "), r)
		}
		oneErrorLine(t, r)
	}
}

// The pgbench script must replay exactly the SQL the Go worker runs per task. It is generated from
// queries/*.sql; this test fails when a query changed and the script did not. To regenerate:
//
//	NOTIFIER_UPDATE_BENCH=1 go test ./cli -run TestPgbenchScript
func TestPgbenchScript(t *testing.T) {
	want := pgbenchScript(t)
	path := filepath.Join("..", "testdata", "bench", "claim_finish.sql")
	if os.Getenv("NOTIFIER_UPDATE_BENCH") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not the claim and finish SQL of queries/ any more: regenerate it with\n"+
			"  NOTIFIER_UPDATE_BENCH=1 go test ./cli -run TestPgbenchScript\n(and map any new parameter in pgbenchParams)", path)
	}
}

// pgbenchParams maps each sqlc parameter of the replayed queries to what the script passes for one
// task: a pgbench variable (\set, or \gset from the claim) or the constant the Go worker sends.
var pgbenchParams = map[string]string{
	"@channels::text[]":              "'{push,sms}'::text[]",
	"@max_tasks":                     ":max_tasks",
	"@ids::bigint[]":                 "ARRAY[:id]::bigint[]",
	"@outcome_uncertain::bool[]":     "'{f}'::bool[]",
	"@worker::text":                  "'pgbench'::text",
	"@lease_seconds::float8":         ":lease_seconds::float8",
	"@task_ids::bigint[]":            "ARRAY[:id]::bigint[]",
	"@attempt_nos::int[]":            "ARRAY[:attempt_count]::int[]",
	"@attempt_tokens::text[]":        "ARRAY[:attempt_token]::text[]",
	"@actions::text[]":               "'{SEND}'::text[]",
	"@states::text[]":                "'{SENT}'::text[]",
	"@needs_review::bool[]":          "'{f}'::bool[]",
	"@provider_msg_ids::text[]":      "'{pgbench-msg}'::text[]",
	"@last_errors::text[]":           `'{""}'::text[]`,
	"@retry_after_seconds::float8[]": "'{-1}'::float8[]",
	"@outcomes::text[]":              "'{ACCEPTED}'::text[]",
	"@errors::text[]":                `'{""}'::text[]`,
}

var sqlcParam = regexp.MustCompile(`@[a-z_]+(::[a-z0-9]+(\[\])?)?`)

// pgbenchScript generates testdata/bench/claim_finish.sql from queries/.
func pgbenchScript(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(`-- GENERATED from queries/*.sql by TestPgbenchScript (cli/bench_test.go); do not edit. After changing a
-- query: NOTIFIER_UPDATE_BENCH=1 go test ./cli -run TestPgbenchScript
--
-- One delivery as a Go worker makes it at --batch 1 (Dispatcher.ClaimBatch, then Dispatcher.FinishBatch
-- or FinishBatchThenClaim with an ACCEPTED observation): the claim transaction and the finish statement of one task, statement
-- for statement, with the parameters of one task: arrays of one element, the task id and attempt token
-- taken from the claim with \gset, constants where the worker sends constants. Run it with -M prepared
-- (pgx prepares every statement too) and the workers' plan_cache_mode (service.WorkerPlanCacheMode)
-- against tasks made by setup.sql, no more transactions than tasks:
--
--   psql "$DATABASE_URL" -v tasks=40000 -f testdata/bench/setup.sql
--   PGOPTIONS='-c plan_cache_mode=force_generic_plan' \
--     pgbench -n -M prepared -c 8 -j 2 -t 5000 -f testdata/bench/claim_finish.sql "$DATABASE_URL"
--
-- Same statements, not the same round trips: the worker sends the previous task's TaskFinish with
-- TxBegin and TaskClaim, then TaskStartAttempts with TxCommit (2 round trips per delivery); pgbench
-- cannot pipeline a statement whose result it \gsets, so here each of the 5 statements waits for its
-- answer.
\set max_tasks 1
\set lease_seconds 60
`)
	header := strings.ReplaceAll(sb.String(), "PLAN_CACHE_MODE", service.WorkerPlanCacheMode)
	sb.Reset()
	sb.WriteString(header)
	stmt := func(file, name string, gset bool) {
		body := queryBody(t, file, name)
		body = sqlcParam.ReplaceAllStringFunc(body, func(p string) string {
			v, ok := pgbenchParams[p]
			if !ok {
				t.Fatalf("%s in %s: parameter %s not mapped in pgbenchParams", name, file, p)
			}
			return v
		})
		body = strings.TrimSuffix(body, ";")
		if gset {
			body += " \\gset\n"
		} else {
			body += ";\n"
		}
		fmt.Fprintf(&sb, "-- %s (queries/%s)\n%s", name, file, body)
	}
	stmt("tx.sql", "TxBegin", false)
	stmt("delivery_task.sql", "TaskClaim", true)
	stmt("delivery_task.sql", "TaskStartAttempts", true)
	stmt("tx.sql", "TxCommit", false)
	sb.WriteString("-- the channel call happens here, outside any transaction; the finish is one autocommit statement\n")
	stmt("delivery_task.sql", "TaskFinish", false)
	return sb.String()
}

// queryBody is the SQL of one named query in queries/FILE, without comment lines.
func queryBody(t *testing.T, file, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "queries", file))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "-- name: "); ok {
			if in {
				break
			}
			in = strings.Fields(rest)[0] == name
			continue
		}
		if !in || strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		lines = append(lines, line)
	}
	body := strings.TrimSpace(strings.Join(lines, "\n"))
	if body == "" {
		t.Fatalf("query %s not found in queries/%s", name, file)
	}
	return body
}

func TestWithPGOption(t *testing.T) {
	is := is.New(t)
	env := withPGOption([]string{"PATH=/bin", "PGOPTIONS=-c work_mem=64MB"}, "plan_cache_mode", "force_generic_plan")
	is.Equal(env, []string{"PATH=/bin", "PGOPTIONS=-c work_mem=64MB -c plan_cache_mode=force_generic_plan"}) // added to the user's options
	env = withPGOption([]string{"PATH=/bin"}, "plan_cache_mode", "auto")
	is.Equal(env, []string{"PATH=/bin", "PGOPTIONS=-c plan_cache_mode=auto"}) // or set alone
}

// --rounds alternates Go deliver phases and pgbench runs and reports each ratio and their median.
func TestBenchRounds(t *testing.T) {
	is := is.New(t)
	c, _ := newCLI(t)
	got, keys := runBenchJSON(t, c, "--notifications", "100", "--warmup", "0", "--workers", "2", "--rounds", "2")
	checkBench(t, got, keys, 100, 2, 1)
	if got.Pgbench == nil {
		t.Skipf("pgbench not found: %s", got.PgbenchSkipped)
	}
	is.Equal(len(got.Rounds), 2)                                 // the main pair and one more
	is.Equal(got.Rounds[0].GoVsPgbench, got.Pgbench.GoVsPgbench) // the first is the main run's
	for _, r := range got.Rounds {
		is.Equal(r.Deliveries, 200)                         // 100 notifications x 2 channels each round
		is.True(r.DeliveriesPerSec > 0 && r.PgbenchTPS > 0) // both sides measured
		is.True(r.GoVsPgbench > 0)                          // and compared
	}
	lo, hi := min(got.Rounds[0].GoVsPgbench, got.Rounds[1].GoVsPgbench), max(got.Rounds[0].GoVsPgbench, got.Rounds[1].GoVsPgbench)
	is.True(got.MedianGoVsPgbench >= lo-0.001 && got.MedianGoVsPgbench <= hi+0.001) // the median of two lies between them
	is.Equal(got.Outbound, 2*200)                                                   // every round's tasks sent once, in the final check
}
