#!/bin/sh
# Ours against the River peer, one after the other on the same database ($DATABASE_URL; `just
# bench-vs-river` starts a throwaway cluster), with the same workload (NOTIFICATIONS events x push and
# sms, 10% repeated submissions) and the same provider model (CALL_LATENCY MEDIAN,SIGMA and
# CALL_ERRORS, seed $SEED), four runs:
#   ours-default   the bench with no tuning flag (notifier work's defaults: one loop, --max-in-flight 1024
#                  --batch 256 --finishers 2); it runs first, and its warm-up warms the cluster for all;
#   ours-best      the bench with $OURS_BEST (default "--workers 2 --max-in-flight 1024 --batch 128",
#                  the best found so far on a 2-core machine);
#   river-N        River at MaxWorkers $RIVER_WORKERS (default 1000), FetchCooldown $FETCH_COOLDOWN (1ms):
#                  River at its best for slow calls;
#   river-W        River at MaxWorkers = ours-default's window (workers x max-in-flight): equal concurrency.
# Then `bench compare` prints deliveries/s of each and ours / River for every pair. Exit 1 if a run
# failed or its final check did.
#
#   bench/vs-river.sh [NOTIFICATIONS=20000] [CALL_LATENCY=instant] [CALL_ERRORS=0]
set -eu
notifications=${1:-20000}
call_latency=${2:-instant}
call_errors=${3:-0}
ours_best=${OURS_BEST:---workers 2 --max-in-flight 1024 --batch 128}
river_workers=${RIVER_WORKERS:-1000}
cooldown=${FETCH_COOLDOWN:-1ms}
seed=${SEED:-1}
: "${DATABASE_URL:?set DATABASE_URL to a throwaway database (sh internal/tools/just bench-vs-river starts one)}"
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$root" && go build -o "$tmp/bench" ./bench/cmd/bench)
(cd "$root/bench/river" && go build -o "$tmp/river" .)
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
# shellcheck disable=SC2086 # $model and $ours_best are lists of flags
run ours-default "$tmp/bench" --json --pgbench=false --notifications "$notifications" --warmup "$warmup" $model
# shellcheck disable=SC2086
run ours-best "$tmp/bench" --json --pgbench=false --notifications "$notifications" --warmup 0 $model $ours_best
window=$("$tmp/bench" compare --window "$tmp/ours-default.json") || {
	echo "vs-river: no report from ours-default, so no window for River at equal concurrency" >&2
	exit 1
}
# shellcheck disable=SC2086
run "river-$river_workers" "$tmp/river" --notifications "$notifications" --workers "$river_workers" --fetch-cooldown "$cooldown" $model
# shellcheck disable=SC2086
run "river-$window" "$tmp/river" --notifications "$notifications" --workers "$window" --fetch-cooldown "$cooldown" $model

reports=
for name in ours-default ours-best "river-$river_workers" "river-$window"; do
	if [ -s "$tmp/$name.json" ]; then
		reports="$reports $name=$tmp/$name.json"
	fi
done
# shellcheck disable=SC2086 # one NAME=FILE per word; $tmp has no spaces (mktemp)
"$tmp/bench" compare $reports || failed=1
exit "$failed"
