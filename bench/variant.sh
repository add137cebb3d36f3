#!/bin/sh
# The schema as it is against a variant of it, in interleaved rounds on one cluster: what a change of the
# rows (an index dropped, a table's fillfactor, a constraint moved) would do to the load bench's pace,
# before anyone writes the queries for it. $DATABASE_URL names a migrated throwaway database (`just
# bench-variant` starts one); two copies of it are made, `notifier_base` and `notifier_variant`, and
# VARIANT.sql is applied to the second. Each round runs the bench (bench/cmd/bench, notifier work's
# defaults, NOTIFICATIONS events x push and sms) on base, then on the variant, and prints deliveries/s,
# the server's CPU per delivery, the calls in flight and the claim's p50 of each; then the medians and
# variant / base. The variant is a measurement, never a migration: what it drops may be what a guarantee
# rests on (docs/benchmarks/2026-12-05-row-costs.md). Exit 1 if a run or its final check failed.
#
# --pin puts the server on core 0 and the bench on the other cores, as bench/vs-river.sh --pin does.
#
#   bench/variant.sh [--rounds N] [--pin] VARIANT.sql [NOTIFICATIONS=20000] [CALL_LATENCY=instant]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/pinned-rounds.sh"
rounds=3
rounds_and_pin variant "$@"
shift "$flags_taken"
case $rounds in '' | 0 | *[!0-9]*)
	echo "variant: --rounds wants a whole number from 1, got $rounds" >&2
	exit 2
	;;
esac
variant=${1:-}
[ -n "$variant" ] && [ -r "$variant" ] || {
	echo "variant: want a readable VARIANT.sql as the first argument, got '${variant}'" >&2
	exit 2
}
notifications=${2:-20000}
call_latency=${3:-instant}
: "${DATABASE_URL:?set DATABASE_URL to a migrated throwaway database (sh internal/tools/just bench-variant starts one)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PGOPTIONS='-c client_min_messages=warning'
(cd "$root" && go build -o "$tmp/bench" ./bench/cmd/bench)

# A database's URL: $DATABASE_URL with its database name replaced.
url_of() {
	printf '%s\n' "$DATABASE_URL" | sed -E "s#^([a-z]+://[^/]*)/[^?]*#\\1/$1#"
}
template=$(psql "$DATABASE_URL" -Atqc 'SELECT current_database()')
for db in notifier_base notifier_variant; do
	psql -q "$(url_of postgres)" -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" \
		-c "CREATE DATABASE $db TEMPLATE \"$template\"" >/dev/null
done
psql -q -v ON_ERROR_STOP=1 "$(url_of notifier_variant)" -f "$variant" >/dev/null

client=
if [ "$pin" = 1 ]; then
	pin_server variant
	echo "pinned: PostgreSQL on core 0, the bench and its fakes on cores 1-$((cores - 1))"
fi

# field NAME FILE: a number of the bench's JSON report (claim_ms: its p50).
field() {
	case $1 in
	claim_ms) sed -n 's/.*"claim_ms":{"p50":\([0-9.]*\).*/\1/p' "$2" ;;
	*) sed -n "s/.*\"$1\":\\([0-9.]*\\).*/\\1/p" "$2" ;;
	esac
}
failed=0
echo "variant: $variant, $notifications events x push and sms, call latency $call_latency, $rounds rounds"
printf '%-6s %-8s %12s %22s %15s %14s\n' round schema deliveries/s "server CPU ms/delivery" "calls in flight" "claim p50 ms"
r=1
while [ "$r" -le "$rounds" ]; do
	for side in base variant; do
		out=$tmp/$r.$side.json
		# shellcheck disable=SC2086 # $client is a command prefix or nothing
		if ! DATABASE_URL=$(url_of "notifier_$side") $client "$tmp/bench" --json --pgbench=false \
			--notifications "$notifications" --call-latency "$call_latency" >"$out" 2>"$tmp/err"; then
			echo "variant: round $r, $side: the bench failed:" >&2
			tail -5 "$tmp/err" >&2
			failed=1
			continue
		fi
		printf '%-6s %-8s %12.0f %22.3f %15.0f %14.1f\n' "$r" "$side" "$(field deliveries_per_sec "$out")" \
			"$(field server_cpu_ms_per_delivery "$out")" "$(field avg_in_flight "$out")" "$(field claim_ms "$out")"
		field deliveries_per_sec "$out" >>"$tmp/$side.rate"
		field server_cpu_ms_per_delivery "$out" >>"$tmp/$side.cpu"
	done
	r=$((r + 1))
done
[ "$failed" = 0 ] || exit 1
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
base_rate=$(median "$tmp/base.rate")
variant_rate=$(median "$tmp/variant.rate")
base_cpu=$(median "$tmp/base.cpu")
variant_cpu=$(median "$tmp/variant.cpu")
awk -v br="$base_rate" -v vr="$variant_rate" -v bc="$base_cpu" -v vc="$variant_cpu" 'BEGIN {
	printf "median  base %.0f/s, %.3f ms; variant %.0f/s, %.3f ms; variant / base: %.2f x deliveries/s, %.2f x server CPU per delivery\n",
		br, bc, vr, vc, vr / br, vc / bc }'
