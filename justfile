# Developer tasks. Run them through the bootstrap script, which installs the
# pinned tools into .tools/ first:   sh internal/tools/just <recipe> [args]

set shell := ["bash", "-eu", "-o", "pipefail", "-c"]
set positional-arguments

root := justfile_directory()
tools := root / ".tools"
# Set by internal/tools/just to the pinned native binary; the npm wrapper otherwise.
dbmate := env("DBMATE", tools / "node_modules/.bin/dbmate")
pgtmp := tools / "bin/pgtmp"

# List the recipes
default:
    @"{{ just_executable() }}" --justfile "{{ justfile() }}" --list --unsorted

# Run the Go tests with the race detector (DB tests start their own throwaway PostgreSQL unless TEST_DATABASE_URL is set; the PgBouncer tests need Debian's pgbouncer and the console's browser tests Debian's chromium, installed here when root or sudo -n can, else skipped); the soak, the batched re-run and the failover harness's cluster tests are in test-long; args go to `go test`, e.g. `just test -run N1 ./service/`
test *args:
    @sh internal/tools/install-debs pgbouncer || echo "just test: pgbouncer could not be installed: the tests through PgBouncer will skip" >&2
    @sh internal/tools/install-debs chromium || echo "just test: chromium could not be installed: the console's browser tests will skip" >&2
    @has_pkg=; for a in "$@"; do case $a in .|./*|../*|github.com/*) has_pkg=1 ;; esac; done; \
    if [ -z "$has_pkg" ]; then set -- "$@" ./...; fi; \
    echo "go test -race -count=1 $*" >&2; \
    go test -race -count=1 "$@"

# Run the long tests, which CI runs after test (docs/testing.md#how-the-tests-run): the protocol tests of service/ again with claims and finishes batched (NOTIFIER_TEST_BATCH=8, and a million scheduled tasks ahead of the claim), then the failover harness's cluster tests (internal/pgha, -pgha), then the soak (40s of faults, -soak); args go to the soak's `go test`, e.g. `just test-long -soak.duration 5m -timeout 20m`
test-long *args:
    @echo "NOTIFIER_TEST_BATCH=8 go test -race -count=1 ./service/  (the protocol tests again, claims and finishes batched)" >&2
    NOTIFIER_TEST_BATCH=8 go test -race -count=1 ./service/ -scheduled.tasks 1000000
    go test -race -count=1 ./internal/pgha/ -pgha
    go test -race -count=1 -run '^TestSoak$' ./cli/ -soak "$@"

# Build the notifier binary into bin/notifier (go install ./cli/notifier puts it in GOBIN as notifier)
build:
    go build -o bin/notifier ./cli/notifier

# Run the demo (`go run ./cli/notifier demo`) on a throwaway migrated PostgreSQL, or on $DATABASE_URL if set; args go to the demo
demo *args: _pgtmp
    @if [ -n "${DATABASE_URL:-}" ]; then exec go run ./cli/notifier demo "$@"; fi; \
    exec "{{ pgtmp }}" -migrate -- go run ./cli/notifier demo "$@"

# Run the load bench (`go run ./bench/cmd/bench`, see docs/benchmarks.md#the-load-bench: the product's worker loop against fakes with a latency model, beside pgbench) on a throwaway migrated PostgreSQL; args go to it, e.g. `just bench --call-latency 100ms,0.8 --max-in-flight 1024`
bench *args: _pgtmp
    "{{ pgtmp }}" -migrate -- go run ./bench/cmd/bench "$@"

# Run the River peer of the load bench (bench/river, its own Go module; docs/benchmarks.md#the-river-peer) on a throwaway migrated PostgreSQL; args go to it, e.g. `just bench-river --notifications 20000 --workers 1000 --fetch-cooldown 1ms --call-latency 100ms,0.8`
bench-river *args: _pgtmp
    "{{ pgtmp }}" -migrate -- bash -c 'cd bench/river && go run . "$@"' _ "$@"

# Run ours (defaults, then $OURS_BEST) and River (MaxWorkers 1000 and MaxWorkers = our window, FetchCooldown 1ms) on one throwaway migrated PostgreSQL with one provider model, and print deliveries/s and the ratios; args: [--rounds N] [--pin] [NOTIFICATIONS] [CALL_LATENCY] [CALL_ERRORS] (bench/vs-river.sh: --rounds interleaves ours-default and River N times, --pin puts PostgreSQL on core 0)
bench-vs-river *args: _pgtmp
    "{{ pgtmp }}" -migrate -- sh bench/vs-river.sh "$@"

# Bulk create against River's InsertMany with unique jobs, in interleaved rounds, durable commits, on one throwaway migrated PostgreSQL: `notifier create --jsonl` of EVENTS events x push and sms; args: [EVENTS=100000] [BATCH=1000] [ROUNDS=3] (bench/create-jsonl.sh)
bench-create-jsonl *args: _pgtmp
    "{{ pgtmp }}" -migrate -- sh bench/create-jsonl.sh "$@"

# Count the instructions one delivery costs the database (bench/cost.sh: a throwaway PostgreSQL under valgrind's callgrind, repeatable to 0.5% where CPU time moves by 10%; docs/benchmarks.md#instructions-per-delivery); args: [--batch N] [--group N] [--locale L] [VARIANT.sql ...], each variant's SQL applied to a copy of the migrated database
bench-cost *args:
    @sh internal/tools/install-debs valgrind || echo "just bench-cost: valgrind could not be installed" >&2
    DBMATE="{{ dbmate }}" sh bench/cost.sh "$@"

# Count the instructions one delivery costs the database, ours against the River peer (bench/cost-vs-river.sh: a throwaway PostgreSQL under valgrind's callgrind, the client backends born in each peer's measured deliver phase, marked by its --phase-hook, counted over their lives; the marginal cost per delivery between SMALL and LARGE events and ours / River; docs/benchmarks/2026-12-06-cost-vs-river.md); args: [--call-latency MEDIAN,SIGMA] [SMALL=500] [LARGE=1500] (more and River's own 10 s timeouts fire under callgrind)
bench-cost-vs-river *args:
    @sh internal/tools/install-debs valgrind || echo "just bench-cost-vs-river: valgrind could not be installed" >&2
    DBMATE="{{ dbmate }}" sh bench/cost-vs-river.sh "$@"

# Measure a variant of the schema against the schema as it is (bench/variant.sh: two copies of one throwaway migrated PostgreSQL, the variant's SQL applied to one, the load bench alternating between them; docs/benchmarks.md#a-variant-of-the-schema); args: [--rounds N] [--pin] VARIANT.sql [NOTIFICATIONS] [CALL_LATENCY], e.g. `just bench-variant --pin bench/variants/task-finish-indexes-dropped.sql 20000 100ms,0.8`
bench-variant *args: _pgtmp
    "{{ pgtmp }}" -migrate -- sh bench/variant.sh "$@"

# Run the failover soak (docs/testing.md#failover-soak): creates and `notifier work` processes on a throwaway pg_auto_failover cluster (installed with apt when missing) whose primary is SIGKILLed -ha.failovers times (5) and rejoined, the invariants checked, then the asynchronous negative controls; args go to `go test`, e.g. `just ha-soak -ha.failovers 10 -ha.control=false`
ha-soak *args:
    sh internal/tools/install-debs postgresql-15-auto-failover pg-auto-failover-cli
    go test -count=1 -timeout 60m -run '^TestHASoak$' -v ./cli/ -ha.soak "$@"

# Start a throwaway PostgreSQL with the migrations applied and print its DATABASE_URL; Ctrl-C stops it and deletes its data
db: _pgtmp
    exec "{{ pgtmp }}" -migrate

# Apply the migrations in schema/ with dbmate to $DATABASE_URL (a multi-host URL: to its host that takes writes, the primary)
migrate:
    @if [ -z "${DATABASE_URL:-}" ]; then echo 'DATABASE_URL is not set (for a local throwaway database: sh internal/tools/just db)' >&2; exit 1; fi; \
    url=$DATABASE_URL; \
    case ${url%%\?*} in *://*,*) url=$(go run ./internal/primary/cmd/primary-url "$url") || exit 1; echo "migrating the primary" >&2 ;; esac; \
    echo "dbmate --migrations-dir schema --no-dump-schema up" >&2; \
    "{{ dbmate }}" --url "$url" --migrations-dir schema --no-dump-schema up

# Check the migrations on a throwaway PostgreSQL: up, roll back one by one to an empty database, up again
migrate-check: _pgtmp
    "{{ pgtmp }}" -db migrate_check -- bash internal/tools/migrate-check

# Write db/schema.sql, the current schema as one file (what the migrations of schema/ give on a throwaway PostgreSQL, dumped by dbmate without pg_dump's version lines; internal/tools/schema-dump): run it after changing schema/ and commit the file
schema-dump: _pgtmp
    "{{ pgtmp }}" -db schema_dump -- env DBMATE="{{ dbmate }}" bash internal/tools/schema-dump

# Check that db/schema.sql is exactly what the migrations of schema/ give (CI runs it after migrate-check)
schema-check: _pgtmp
    "{{ pgtmp }}" -db schema_check -- env DBMATE="{{ dbmate }}" bash internal/tools/schema-dump --check

# Regenerate dbgen/ from schema/ and queries/ with sqlc (installs sqlc v1.31.1 into .tools/bin on first use, a few minutes)
generate:
    sqlc=$(sh internal/tools/install-sqlc); "$sqlc" generate

# Fail if dbgen/ is stale (sqlc diff) or sqlc vet complains (installs sqlc on first use)
sqlc-check:
    sqlc=$(sh internal/tools/install-sqlc); "$sqlc" diff; "$sqlc" vet; echo 'sqlc-check: generated code is up to date'

# Mutation testing with gremlins (v0.6.0, installed into .tools/bin on first use) of the packages whose tests need no database (worker's few database tests skip: PGTEST_SKIP=1), each held to .gremlins.yaml's thresholds (85% efficacy and mutator coverage); args: other packages, e.g. `just mutants ./service/redact`
mutants *args:
    @gremlins=$(sh internal/tools/install-gremlins); \
    if [ $# -eq 0 ]; then set -- ./service/delivery ./service/httpkit ./service/redact ./service/channelconfig ./worker ./bench/latency ./bench/compare; fi; \
    failed=; for pkg in "$@"; do \
      echo "==> gremlins unleash $pkg" >&2; \
      PGTEST_SKIP=1 GOFLAGS=-count=1 "$gremlins" unleash "$pkg" || failed="$failed $pkg"; \
    done; \
    if [ -n "$failed" ]; then echo "mutants: below the thresholds of .gremlins.yaml (or gremlins failed):$failed" >&2; exit 1; fi

# Mutation testing of the claim and the finish (service/claim.go, claimfallback.go, pipelinetx.go, finish.go; args: other files of service/), which need the database: gremlins on one throwaway PostgreSQL (on a tmpfs, as the tests' own), each mutant rerunning the tests of those paths, two at a time (117 mutants, about 20 minutes here; docs/testing.md#mutation-testing)
mutants-service *args: _pgtmp
    "{{ pgtmp }}" -tmpfs -- sh internal/tools/mutants-service "$@"

# Static analysis with staticcheck (v0.8.2, installed into .tools/bin on first use, its default checks) over ./... (bench/river is a module of its own); args: other packages
staticcheck *args:
    @staticcheck=$(sh internal/tools/install-staticcheck); \
    if [ $# -eq 0 ]; then set -- ./...; fi; \
    "$staticcheck" "$@"; echo 'staticcheck: clean' >&2

# Check the alert rules (deploy/prometheus/notifier-rules.yml) with promtool from Debian's prometheus package (installed here when root or sudo -n can): promtool check rules, then its unit tests (promtool test rules notifier-rules.test.yml: each alert firing and not firing). Which metrics they name is checked against a running worker by `go test ./cli -run TestAlertRulesAndDashboardNameExportedMetrics`
alerts-check:
    sh internal/tools/install-debs prometheus
    promtool check rules deploy/prometheus/notifier-rules.yml
    cd deploy/prometheus && promtool test rules notifier-rules.test.yml

# Run what CI runs (.ci/run): staticcheck, test, test-long, alerts-check, river-vet, benchmarks, sqlc-check, migrate-check, schema-check, ha-soak
ci:
    bash .ci/run

# Build the throwaway-cluster helper (internal/pgtest/cmd/pgtmp) into .tools/bin
[private]
_pgtmp:
    @go build -o "{{ pgtmp }}" ./internal/pgtest/cmd/pgtmp
