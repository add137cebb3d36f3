#!/bin/sh
# Ours against the River peer, one after the other on the same database ($DATABASE_URL; `just
# bench-vs-river` starts a throwaway cluster), with the same workload: NOTIFICATIONS events x push and
# sms, 10% repeated submissions, WORKERS workers, instant in-process fakes. Ours runs batched (BATCH
# tasks per claim and per finish transaction) and first, so its warm-up also warms the cluster for River
# (River tuned with FETCH_COOLDOWN; its default is 100ms). Prints both JSON reports and the ratio of
# deliveries per second. Exit 1 if either side's final check failed.
#
#   bench/vs-river.sh [NOTIFICATIONS=20000] [WORKERS=8] [BATCH=16] [FETCH_COOLDOWN=1ms]
set -eu
notifications=${1:-20000}
workers=${2:-8}
batch=${3:-16}
cooldown=${4:-1ms}
: "${DATABASE_URL:?set DATABASE_URL to a throwaway database (sh internal/tools/just bench-vs-river starts one)}"
root=$(cd "$(dirname "$0")/.." && pwd)

ours=$(cd "$root" && go run ./cli bench --json --pgbench=false \
	--notifications "$notifications" --workers "$workers" --batch "$batch")
echo "ours:  $ours"
river=$(cd "$root/bench/river" && go run . \
	--notifications "$notifications" --workers "$workers" --fetch-cooldown "$cooldown")
echo "river: $river"

field() { printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
ours_rate=$(field "$ours" deliveries_per_sec)
river_rate=$(field "$river" deliveries_per_sec)
ours_check=$(field "$ours" check)
river_check=$(field "$river" check)
awk -v o="$ours_rate" -v r="$river_rate" -v b="$batch" -v c="$cooldown" -v oc="$ours_check" -v rc="$river_check" 'BEGIN {
	printf "ours (notifier bench --batch %s): %8.0f deliveries/s   check %s\n", b, o, oc
	printf "River (FetchCooldown %s):         %8.0f deliveries/s   check %s\n", c, r, rc
	printf "ours / River = %.2f\n", o / r
}'
[ "$ours_check" = ok ] && [ "$river_check" = ok ]
