#!/bin/sh
# Ours against the River peer, one after the other on the same database ($DATABASE_URL; `just
# bench-vs-river` starts a throwaway cluster), with the same workload (NOTIFICATIONS events x push and
# sms, 10% repeated submissions) and the same provider model (CALL_LATENCY MEDIAN,SIGMA and
# CALL_ERRORS, seed $SEED), four runs, each after a warm-up of its own (min(NOTIFICATIONS, 4000) events
# delivered and not measured: its process's HTTP connections and statements, and the cluster, warm):
#   ours-default   the bench with no tuning flag (notifier work's defaults: one loop, --max-in-flight 1024
#                  --batch 256 --finishers 2);
#   ours-best      the bench with $OURS_BEST (default "--workers 2 --max-in-flight 1024 --batch 128",
#                  the best found so far on a 2-core machine);
#   river-N        River at MaxWorkers $RIVER_WORKERS (default 1000), FetchCooldown $FETCH_COOLDOWN (1ms):
#                  River at its best for slow calls;
#   river-W        River at MaxWorkers = ours-default's window (workers x max-in-flight): equal concurrency.
# Then `bench compare` prints deliveries/s of each and ours / River for every pair. Exit 1 if a run
# failed or its final check did.
#
# --rounds N (N >= 2) runs instead ours-default and river-N alternately, N times each (ours, River, ours,
# River...), so that the machine's drift falls on both alike, and prints every round and the median
# ratio with its spread (`bench compare --rounds`). $OURS_FLAGS are added to ours-default's flags then
# (e.g. --finishers 4), to measure one change in the same interleaving.
#
# --pin moves the PostgreSQL server (the postmaster and every backend, which inherit it) onto core 0 and
# runs the peers, with their fakes, on the other cores (taskset): the production shape, where the
# database is a machine of its own and the workers scale out (docs/benchmarks.md#the-production-shape).
# The server must run on this machine and be ours to move (a throwaway cluster).
#
#   bench/vs-river.sh [--rounds N] [--pin] [NOTIFICATIONS=20000] [CALL_LATENCY=instant] [CALL_ERRORS=0]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/pinned-rounds.sh"
rounds=1
rounds_and_pin vs-river "$@"
shift "$flags_taken"
case $rounds in '' | *[!0-9]*)
	echo "vs-river: --rounds wants a whole number, got $rounds" >&2
	exit 2
	;;
esac
notifications=${1:-20000}
call_latency=${2:-instant}
call_errors=${3:-0}
ours_best=${OURS_BEST:---workers 2 --max-in-flight 1024 --batch 128}
river_workers=${RIVER_WORKERS:-1000}
cooldown=${FETCH_COOLDOWN:-1ms}
seed=${SEED:-1}
: "${DATABASE_URL:?set DATABASE_URL to a throwaway database (sh internal/tools/just bench-vs-river starts one)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$root" && go build -o "$tmp/bench" ./bench/cmd/bench)
(cd "$root/bench/river" && go build -o "$tmp/river" .)

# The peers run under $client (taskset onto cores 1.. with --pin), the server on core 0.
client=
if [ "$pin" = 1 ]; then
	pin_server vs-river
	echo "== pinned: PostgreSQL (postmaster $postmaster and its children) on core 0, the peers and the fakes on cores 1-$((cores - 1))" >&2
fi
model="--call-latency $call_latency --call-errors $call_errors --seed $seed"
warmup=$((notifications < 4000 ? notifications : 4000))

failed=0
# run NAME COMMAND...: the command's JSON report into $tmp/NAME.json; a failure is noted, not fatal, so
# that the other runs and the comparison still print.
run() {
	name=$1
	shift
	echo "== $name: $*" >&2
	if ! "$@" >"$tmp/$name.json"; then
		echo "== $name failed" >&2
		failed=1
	fi
}
if [ "$rounds" -ge 2 ]; then
	reports=
	round=1
	while [ "$round" -le "$rounds" ]; do
		# Every round warms up alike: the first run of the database pays for its cold caches otherwise.
		# shellcheck disable=SC2086 # $client, $model and $OURS_FLAGS are lists of words
		run "ours-default.$round" $client "$tmp/bench" --json --pgbench=false --notifications "$notifications" --warmup "$warmup" $model ${OURS_FLAGS:-}
		# shellcheck disable=SC2086
		run "river-$river_workers.$round" $client "$tmp/river" --notifications "$notifications" --warmup "$warmup" --workers "$river_workers" --fetch-cooldown "$cooldown" $model
		for name in "ours-default.$round" "river-$river_workers.$round"; do
			[ -s "$tmp/$name.json" ] && reports="$reports $name=$tmp/$name.json"
		done
		round=$((round + 1))
	done
	[ "$pin" = 1 ] && echo "pinned: PostgreSQL on core 0, the peers and the fakes on cores 1-$((cores - 1))"
	# shellcheck disable=SC2086 # one NAME=FILE per word; $tmp has no spaces (mktemp)
	"$tmp/bench" compare --rounds $reports || failed=1
	exit "$failed"
fi

# shellcheck disable=SC2086 # $client, $model and $ours_best are lists of flags
run ours-default $client "$tmp/bench" --json --pgbench=false --notifications "$notifications" --warmup "$warmup" $model
# shellcheck disable=SC2086
run ours-best $client "$tmp/bench" --json --pgbench=false --notifications "$notifications" --warmup "$warmup" $model $ours_best
window=$("$tmp/bench" compare --window "$tmp/ours-default.json") || {
	echo "vs-river: no report from ours-default, so no window for River at equal concurrency" >&2
	exit 1
}
# shellcheck disable=SC2086
run "river-$river_workers" $client "$tmp/river" --notifications "$notifications" --warmup "$warmup" --workers "$river_workers" --fetch-cooldown "$cooldown" $model
# shellcheck disable=SC2086
run "river-$window" $client "$tmp/river" --notifications "$notifications" --warmup "$warmup" --workers "$window" --fetch-cooldown "$cooldown" $model

reports=
for name in ours-default ours-best "river-$river_workers" "river-$window"; do
	if [ -s "$tmp/$name.json" ]; then
		reports="$reports $name=$tmp/$name.json"
	fi
done
[ "$pin" = 1 ] && echo "pinned: PostgreSQL on core 0, the peers and the fakes on cores 1-$((cores - 1))"
# shellcheck disable=SC2086 # one NAME=FILE per word; $tmp has no spaces (mktemp)
"$tmp/bench" compare $reports || failed=1
exit "$failed"
