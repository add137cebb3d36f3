#!/bin/sh
# Bulk create against River's bulk insert, in interleaved rounds on one database ($DATABASE_URL; `just
# bench-create-jsonl` starts a throwaway cluster), durable commits (fsync and synchronous_commit on,
# checked): each round
#   ours   `notifier create --jsonl FILE --batch-size BATCH`, one process, EVENTS events of fresh users
#          who each have a push and an sms preference (set beforehand, not timed): 2 tasks per event;
#   river  bench/river --insert-only --insert-batch BATCH: the same EVENTS events, each 2 unique jobs
#          (unique by user, event, channel), BATCH events per InsertMany from one goroutine.
# Each round prints events/s of both and the ratio; then the medians. The file's generation is not
# timed; ours' time includes the process's start and its reading and printing of every line. Exit 1 if a
# run failed or did not create every event exactly once.
#
#   bench/create-jsonl.sh [EVENTS=100000] [BATCH=1000] [ROUNDS=3]
set -eu
events=${1:-100000}
batch=${2:-1000}
rounds=${3:-3}
: "${DATABASE_URL:?set DATABASE_URL to a throwaway database (sh internal/tools/just bench-create-jsonl starts one)}"
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && go build -o "$tmp/notifier" ./cli/notifier)
(cd "$root/bench/river" && go build -o "$tmp/river" .)
psql_() { psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -Atq "$@"; }
settings=$(psql_ -c "SELECT current_setting('fsync') || ' ' || current_setting('synchronous_commit')")
if [ "$settings" != "on on" ]; then
	echo "create-jsonl: the server runs with fsync, synchronous_commit = $settings; want durable commits (on on)" >&2
	exit 1
fi
users=$((events / 10 > 0 ? events / 10 : 1))
now() { date +%s.%N; }
failed=0
results=
round=1
while [ "$round" -le "$rounds" ]; do
	run="cj$round-$$"
	psql_ -c "INSERT INTO channel_pref (user_id, channel, address)
		SELECT '$run-u' || u, ch, '$run-u' || u || '@' || ch FROM generate_series(0, $users - 1) u, (VALUES ('push'), ('sms')) c(ch)"
	awk -v n="$events" -v users="$users" -v run="$run" 'BEGIN { for (i = 0; i < n; i++)
		printf "{\"user\":\"%s-u%d\",\"event_key\":\"ev-%d\",\"body\":\"bench event %d\"}\n", run, i % users, i, i }' >"$tmp/events.jsonl"
	psql_ -c "CHECKPOINT" # each peer starts from the same state of the WAL
	t0=$(now)
	if ! "$tmp/notifier" create --jsonl "$tmp/events.jsonl" --batch-size "$batch" >"$tmp/out.jsonl"; then
		echo "create-jsonl: round $round: notifier create --jsonl failed" >&2
		failed=1
	fi
	t1=$(now)
	created=$(grep -c '"created":true' "$tmp/out.jsonl" || true)
	tasks=$(psql_ -c "SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id WHERE n.user_id LIKE '$run-u%'")
	if [ "$created" != "$events" ] || [ "$tasks" != $((2 * events)) ]; then
		echo "create-jsonl: round $round: $created of $events events created, $tasks tasks (want $((2 * events)))" >&2
		failed=1
	fi
	ours=$(awk -v a="$t0" -v b="$t1" -v n="$events" 'BEGIN { printf "%.0f", n / (b - a) }')
	psql_ -c "CHECKPOINT"
	if ! "$tmp/river" --notifications "$events" --duplicates 0 --insert-batch "$batch" --insert-only >"$tmp/river.json"; then
		echo "create-jsonl: round $round: the River peer failed" >&2
		failed=1
	fi
	river=$(sed -n 's/.*"inserts_per_sec":\([0-9.]*\).*/\1/p' "$tmp/river.json" | awk '{ printf "%.0f", $1 }')
	ratio=$(awk -v a="$ours" -v b="${river:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
	printf 'round %d: ours %s events/s (%s events in %.2f s), River InsertMany %s events/s, ours / River %s\n' \
		"$round" "$ours" "$events" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "${river:--}" "$ratio"
	results="$results$ours $river $ratio
"
	round=$((round + 1))
done
printf '%s' "$results" | awk -v n="$rounds" -v events="$events" -v batch="$batch" '
	{ o[NR] = $1; r[NR] = $2; q[NR] = $3 }
	function med(a,   i, j, t, m) { m = NR; for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
	END { lo = q[1]; hi = q[1]; for (i = 2; i <= NR; i++) { if (q[i] < lo) lo = q[i]; if (q[i] > hi) hi = q[i] }
		printf "median over %d rounds (%d events x 2 channels, batches of %d, fsync and synchronous_commit on): ours %.0f events/s, River %.0f, ours / River %.2f (spread %.2f-%.2f)\n",
			n, events, batch, med(o), med(r), med(q), lo, hi }'
exit "$failed"
