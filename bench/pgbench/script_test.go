package pgbench

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// The pgbench script must replay exactly the SQL the Go worker runs per task. It is generated from
// queries/*.sql; this test fails when a query changed and the script did not. To regenerate:
//
//	NOTIFIER_UPDATE_BENCH=1 go test ./bench/pgbench -run TestPgbenchScript
func TestPgbenchScript(t *testing.T) {
	want := pgbenchScript(t)
	path := ReplayScript
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
			"  NOTIFIER_UPDATE_BENCH=1 go test ./bench/pgbench -run TestPgbenchScript\n(and map any new parameter in pgbenchParams)", path)
	}
}

// pgbenchParams maps each sqlc parameter of the replayed queries to what the script passes for one
// task: a pgbench variable (\set, or \gset from the claim) or the constant the Go worker sends.
var pgbenchParams = map[string]string{
	"@channel::text":                 "'push'::text",
	"@max_tasks":                     ":max_tasks",
	"@max_tasks::int":                ":max_tasks::int",
	"@ids::bigint[]":                 "ARRAY[:id]::bigint[]",
	"@outcome_uncertain::bool[]":     "'{f}'::bool[]",
	"@worker::text":                  "'pgbench'::text",
	"@lease_seconds::float8":         ":lease_seconds::float8",
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

// pgbenchParamsOf overrides pgbenchParams for one query: the claim chooses a fresh attempt token (the
// Go worker sends a random UUID), the finish sends the one the claim returned (\gset).
var pgbenchParamsOf = map[string]map[string]string{
	"TaskStartAttempts": {"@attempt_tokens::text[]": "ARRAY[gen_random_uuid()::text]"},
}

var sqlcParam = regexp.MustCompile(`@[a-z_]+(::[a-z0-9]+(\[\])?)?`)

// pgbenchScript generates claim_finish.sql from queries/.
func pgbenchScript(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(`-- GENERATED from queries/*.sql by TestPgbenchScript (bench/pgbench/script_test.go); do not edit.
-- After changing a query: NOTIFIER_UPDATE_BENCH=1 go test ./bench/pgbench -run TestPgbenchScript
--
-- One delivery as a Go worker makes it at --max-in-flight 1 --batch 1 (Dispatcher.ClaimBatch, then
-- Dispatcher.FinishBatch with an ACCEPTED observation): the claim transaction and the finish statement
-- of one task, statement for statement, with the parameters of one task: arrays of one element, the
-- task id and attempt token taken from the claim with \gset, constants where the worker sends
-- constants. Run it with -M prepared (pgx prepares every statement too) and the workers'
-- plan_cache_mode (service.WorkerPlanCacheMode) against tasks made by setup.sql, no more transactions
-- than tasks:
--
--   psql "$DATABASE_URL" -v tasks=40000 -f bench/pgbench/setup.sql
--   PGOPTIONS='-c plan_cache_mode=PLAN_CACHE_MODE' \
--     pgbench -n -M prepared -c 8 -j 2 -t 5000 -f bench/pgbench/claim_finish.sql "$DATABASE_URL"
--
-- Same statements, not the same round trips: at --max-in-flight 1 the worker sends TaskFinish of the
-- previous task with TxBegin and TaskClaim (the finish carries the next claim), then TaskStartAttempts
-- with TxCommit: 2 round trips per delivery; pgbench cannot pipeline a statement whose result it
-- \gsets, so here each of the 5 statements waits for its answer. The worker claims one channel per
-- TaskClaim, its channels in turn; setup.sql makes push tasks only, and the script claims push.
\set max_tasks 1
\set lease_seconds 60
`)
	header := strings.ReplaceAll(sb.String(), "PLAN_CACHE_MODE", service.WorkerPlanCacheMode)
	sb.Reset()
	sb.WriteString(header)
	stmt := func(file, name string, gset bool) {
		body := queryBody(t, file, name)
		body = sqlcParam.ReplaceAllStringFunc(body, func(p string) string {
			v, ok := pgbenchParamsOf[name][p]
			if !ok {
				v, ok = pgbenchParams[p]
			}
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
	data, err := os.ReadFile(filepath.Join("..", "..", "queries", file))
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

func TestParseSummary(t *testing.T) {
	is := is.New(t)
	out := `transaction type: claim_finish.sql
number of clients: 8
number of transactions per client: 500
number of transactions actually processed: 4000/4000
number of failed transactions: 0 (0.000%)
latency average = 7.412 ms
initial connection time = 21.5 ms
tps = 1079.334 (without initial connection time)
`
	var g Report
	is.NoErr(parse(out, &g))        // a complete run
	is.Equal(g.TPS, 1079.334)       // tps read
	is.Equal(g.LatencyAvgMS, 7.412) // latency read
	short := strings.Replace(out, "4000/4000", "3990/4000", 1)
	is.True(parse(short, &g) != nil) // not every transaction ran: refused
	failed := strings.Replace(out, "failed transactions: 0", "failed transactions: 3", 1)
	is.True(parse(failed, &g) != nil) // failed transactions: refused
}

// The built-in scripts are the files of this directory, written out for psql and pgbench.
func TestScriptsBuiltIn(t *testing.T) {
	is := is.New(t)
	dir, cleanup, err := Scripts("")
	is.NoErr(err)
	defer cleanup()
	for _, f := range []string{SetupScript, ReplayScript} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		is.NoErr(err)
		want, err := os.ReadFile(f)
		is.NoErr(err)
		is.Equal(string(got), string(want)) // the embedded copy is the file
	}
	_, _, err = Scripts(t.TempDir())
	is.True(err != nil) // a directory without the scripts is refused
}
