#!/bin/sh
# What one delivery costs the PostgreSQL server, ours against the River peer, in instructions counted
# by valgrind's callgrind, beside the server's CPU time from /proc (bench-vs-river), which counts
# kernel time and the background processes too, and moves from round to round with them. Both peers
# batch by timing, so the count moves by about 10% from run to run
# (docs/benchmarks/2026-12-06-cost-vs-river.md).
#
# Starts a throwaway PostgreSQL 15 under callgrind (bench/callgrind-server.sh; --trace-children=yes: the postmaster and every
# process it forks; autovacuum off, and no timed checkpoint) and migrates a template database with
# schema/. On a fresh copy of it each, runs ours (bench/cmd/bench with notifier work's defaults) and
# River (bench/river, MaxWorkers 1000 and FetchCooldown 1ms, its best setting, as in bench-vs-river;
# it runs its own migrations), first for SMALL events then for LARGE (x push and sms), each peer with
# its own warm-up of $WARMUP events (500) and the same provider model (--call-latency, instant).
#
# Only the measured deliver phase is counted, as the /proc figure counts it, not the creation of the
# events. Each peer calls this script back through its --phase-hook: with "start" when its events are
# created and before it opens the phase's connections (its pools are empty then), with "end" when the
# last delivery is done and its workers have stopped. At start: ANALYZE (ours runs it before its
# phase; River's tables would have no statistics with autovacuum off) and CHECKPOINT (no dirty page of
# the creation is written during the phase, and every page the phase changes pays its full-page image
# alike for both), then the postmaster's children are listed. At end they are listed again. The
# backends born between the marks are the phase's: every statement of the phase runs on them, and they
# exit when the peer closes its connections, callgrind writing each one's count for its whole life.
#
# Why whole lives: zeroing and dumping the running processes at the marks (callgrind_control -z/-d)
# needs vgdb to interrupt processes asleep in a system call with ptrace, and here that left the
# postmaster stopped, the call hung. So only client backends are counted: the postmaster, the
# checkpointer, the background writer and the walwriter live through every run and cannot be split
# between them. A backend's life also holds its start-up (tens of millions of instructions under
# callgrind), the first plans of its statements, the peer's start and stop (River's leader election
# and maintenance services) and its exit: fixed costs per run, which the headline cancels. It is the
# marginal cost: (LARGE run - SMALL run) / (LARGE - SMALL deliveries). Each run's own count per
# delivery is printed too, with those fixed costs in it.
#
#   bench/cost-vs-river.sh [--call-latency MEDIAN,SIGMA] [SMALL=500] [LARGE=1500]
#
# Needs valgrind, PostgreSQL 15's server binaries, psql and dbmate ($DBMATE,
# as `just bench-cost-vs-river` sets it); as root, the server runs as nobody. $KEEP, when set, is a
# directory to copy each run's JSON report and per-process counts into. Callgrind makes the server
# about 50x slower: about 4 minutes at the defaults (500 and 1,500 events) on 2 cores; at 1,000 and 3,000,
# River's own 10 s timeouts fired once (such a run is reported and the script exits 1).
set -eu

# The peers' --phase-hook: bench/cost-vs-river.sh --mark RUNDIR start|end, with $CVR_DIR (the
# server's directory: its data and the callgrind files) and $CVR_DB_URL (the run's database).
if [ "${1:-}" = --mark ]; then
	run=$2
	children() { ps -o pid= --ppid "$(head -1 "$CVR_DIR/data/postmaster.pid")" | tr -d ' ' | sort; }
	case $3 in
	start)
		backend=$(psql -qAt -v ON_ERROR_STOP=1 "$CVR_DB_URL" -c ANALYZE -c CHECKPOINT -c 'SELECT pg_backend_pid()')
		for _ in $(seq 600); do # that backend has exited and written its profile, before the mark
			[ -e "$CVR_DIR/cg.$backend" ] && break
			sleep 0.1
		done
		children >"$run/before"
		touch "$run/start"
		;;
	end)
		# The backends born since the mark: those alive now, and those that exited (their profile is
		# written), less those alive at the mark and the server's own processes.
		{
			children
			find "$CVR_DIR" -maxdepth 1 -name 'cg.*' -newer "$run/start" | sed 's,.*/cg\.,,'
		} | sort -u | grep -vxF -f "$run/before" | grep -vxF -f "$CVR_DIR/other-pids" >"$run/pids" || true
		;;
	*)
		echo "cost-vs-river --mark: want start or end, got $3" >&2
		exit 2
		;;
	esac
	exit 0
fi

latency=instant
while [ $# -gt 0 ]; do
	case $1 in
	--call-latency)
		latency=${2:?--call-latency wants a model, e.g. 10ms,0.5}
		shift 2
		;;
	--*)
		echo "cost-vs-river: unknown flag $1 (want --call-latency MEDIAN,SIGMA)" >&2
		exit 2
		;;
	*) break ;;
	esac
done
small=${1:-500}
large=${2:-1500}
warmup=${WARMUP:-500}
for n in "$small" "$large" "$warmup"; do
	case $n in '' | *[!0-9]*)
		echo "cost-vs-river: SMALL, LARGE and \$WARMUP want whole numbers, got '$n'" >&2
		exit 2
		;;
	esac
done
[ "$small" -ge 1 ] && [ "$large" -gt "$small" ] || {
	echo "cost-vs-river: want 1 <= SMALL < LARGE, got $small and $large" >&2
	exit 2
}
for tool in valgrind psql jq; do
	command -v "$tool" >/dev/null || {
		echo "cost-vs-river: $tool is not installed (valgrind: apt-get install valgrind)" >&2
		exit 1
	}
done
. "$(dirname "$0")/callgrind-server.sh"
callgrind_dir
export PGOPTIONS='-c client_min_messages=warning'

(cd "$root" && go build -o "$dir/bench" ./bench/cmd/bench)
(cd "$root/bench/river" && go build -o "$dir/river" .)
callgrind_start C.UTF-8 -c max_connections=50 -c checkpoint_timeout=1d -c max_wal_size=8GB
psql -q -v ON_ERROR_STOP=1 "$url/postgres" -c 'CREATE DATABASE cvr_template' >/dev/null
"$dbmate" --url "$url/cvr_template?sslmode=disable" --migrations-dir "$root/schema" --no-dump-schema up >/dev/null
# The server's processes that are not client backends, which live as long as it: one pid a line.
{
	head -1 "$dir/data/postmaster.pid"
	psql -qAt "$url/postgres" -c "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'"
} >"$dir/other-pids"

model="--call-latency $latency"
failed=0
# measure PEER EVENTS: one run on a fresh copy of the template; its figures into $dir/PEER-EVENTS/.
measure() {
	peer=$1 events=$2
	name=$peer-$events
	run=$dir/$name
	mkdir "$run"
	psql -q -v ON_ERROR_STOP=1 "$url/postgres" -c "CREATE DATABASE cvr_${peer}_$events TEMPLATE cvr_template" >/dev/null
	db="$url/cvr_${peer}_$events?sslmode=disable"
	hook="sh '$root/bench/cost-vs-river.sh' --mark '$run'"
	echo "== $name: $events events x push and sms, warm-up $warmup, $model" >&2
	t0=$(date +%s)
	# The deadlines are raised: every statement is ~50x slower under callgrind.
	# shellcheck disable=SC2086 # $model is two words
	case $peer in
	ours) set -- "$dir/bench" --json --pgbench=false --notifications "$events" --warmup "$warmup" $model \
		--db-timeout 10m --timeout 3h --phase-hook "$hook" ;;
	river) set -- "$dir/river" --notifications "$events" --warmup "$warmup" --workers 1000 --fetch-cooldown 1ms $model \
		--timeout 3h --phase-hook "$hook" ;;
	esac
	status=0
	CVR_DIR=$dir CVR_DB_URL=$db DATABASE_URL=$db "$@" >"$run/report.json" 2>"$run/stderr" || status=$?
	cat "$run/stderr" >&2
	if [ "$status" != 0 ]; then
		echo "== $name failed" >&2
		failed=1
		return 0
	fi
	# River bounds its fetches and completions by 10 s of its own (not a setting): under callgrind a
	# big completion batch can exceed it, and the cancelled statement's work is counted, then redone.
	if grep -q 'timed out after' "$run/stderr"; then
		echo "== $name: River's own 10 s timeouts fired, statements were cancelled and retried: its count holds wasted work; use fewer events" >&2
		failed=1
	fi
	echo $(($(date +%s) - t0)) >"$run/seconds"
	[ -s "$run/pids" ] || {
		echo "== $name: no backend was born between the marks" >&2
		failed=1
		return 0
	}
	# PID INSTRUCTIONS for each backend of the phase, from its profile, written when it exited (the
	# peer has exited: its connections are closed).
	while read -r p; do
		for _ in $(seq 1200); do
			grep -q '^totals:' "$dir/cg.$p" 2>/dev/null && break
			sleep 0.1
		done
		echo "$p $(awk '/^totals:/ { print $2 }' "$dir/cg.$p")"
	done <"$run/pids" >"$run/processes"
	echo "== $name: $(cat "$run/seconds") s; $(wc -l <"$run/pids") backends born between the marks" >&2
	if [ -n "${KEEP:-}" ]; then
		mkdir -p "$KEEP/$name"
		cp "$run/report.json" "$run/processes" "$KEEP/$name/"
	fi
}

for events in "$small" "$large"; do
	measure ours "$events"
	measure river "$events"
done

# One line per run, then the marginal cost and the ratios.
for events in "$small" "$large"; do
	for peer in ours river; do
		run=$dir/$peer-$events
		[ -s "$run/processes" ] || continue
		deliveries=$(jq -r .deliveries "$run/report.json")
		rows=$(jq -r .db_rows_written_per_delivery "$run/report.json")
		xacts=$(jq -r .db_xacts_per_delivery "$run/report.json")
		awk -v peer="$peer" -v events="$events" -v d="$deliveries" -v rows="$rows" -v xacts="$xacts" -v secs="$(cat "$run/seconds")" '
			{ b += $2; n++ }
			END { printf "%s %s %d %.0f %d %s %s %s\n", peer, events, d, b, n, rows, xacts, secs }' "$run/processes"
	done
done >"$dir/summary"
echo "server instructions per delivery: callgrind, the backends born in the deliver phase, their whole lives ($model, warm-ups of $warmup events)"
awk -v small="$small" -v large="$large" '
	{ d[$1, $2] = $3; b[$1, $2] = $4; runs[++n] = $0 }
	END {
		printf "%-12s %10s %9s %16s %14s %9s %10s %7s\n", "run", "deliveries", "backends", "instructions", "per delivery", "rows/dlv", "xacts/dlv", "wall s"
		for (i = 1; i <= n; i++) {
			split(runs[i], f, " ")
			printf "%-12s %10d %9d %16.0f %14.0f %9s %10s %7d\n", f[1] "-" f[2], f[3], f[5], f[4], f[4] / f[3], f[6], f[7], f[8]
		}
		if (!(("ours", small) in d) || !(("ours", large) in d) || !(("river", small) in d) || !(("river", large) in d)) exit
		for (p = 1; p <= 2; p++) {
			peer = p == 1 ? "ours" : "river"
			m[peer] = (b[peer, large] - b[peer, small]) / (d[peer, large] - d[peer, small])
			t[peer] = b[peer, large] / d[peer, large]
		}
		printf "\n%-44s %12s %12s %10s\n", "", "ours", "River", "ours/River"
		printf "%-44s %12.0f %12.0f %10.3f\n", "marginal: (" large "-event run - " small "-event run) / extra deliveries", m["ours"], m["river"], m["ours"] / m["river"]
		printf "%-44s %12.0f %12.0f %10.3f\n", "the " large "-event run / its deliveries", t["ours"], t["river"], t["ours"] / t["river"]
	}' "$dir/summary"
exit "$failed"
