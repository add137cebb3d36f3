#!/bin/sh
# What one delivery costs the database, in instructions: repeatable to about 0.5%, whatever else the
# machine is doing, where CPU time here moves by 10% from run to run (docs/benchmarks.md#instructions-per-delivery).
#
# Starts a throwaway PostgreSQL under valgrind's callgrind (bench/callgrind-server.sh: every backend counted), migrates a template
# database with schema/ and gives it 100,000 SENT tasks with their attempts (so that the worker's generic
# plans are those of a used database), then for each variant: a copy of the template, the variant's SQL
# file applied (none: the schema as it is), and bench/cmd/costprobe run twice on one connection, for
# 500 and 1,500 events (1,000 and 3,000 deliveries). The claiming backend's instructions of the second
# run minus the first's, divided by 2,000, are the instructions per delivery: connection set-up and
# first plans cancel out.
#
#   bench/cost.sh [--batch N] [--group N] [--locale L] [VARIANT.sql ...]
#
# --batch and --group go to costprobe (tasks per claim, answers per finish: 200 and 25 by default).
# --locale is the cluster's (initdb --locale, C.UTF-8 by default, as the tests' clusters): text keys
# compared under a language's collation cost more (en_US.UTF-8, the default of many installations; it
# must be in `locale -a`: localedef -i en_US -f UTF-8 en_US.UTF-8).
# Needs valgrind, PostgreSQL 15's server binaries and dbmate ($DBMATE, as `just bench-cost` sets it);
# as root, the server runs as nobody. About three minutes to set up, then two per variant.
set -eu
probe_flags=
locale=C.UTF-8
while [ $# -gt 0 ]; do
	case $1 in
	--batch | --group)
		case ${2:-} in '' | *[!0-9]*)
			echo "cost: $1 wants a whole number" >&2
			exit 2
			;;
		esac
		probe_flags="$probe_flags $1 $2"
		shift 2
		;;
	--locale)
		locale=${2:?--locale wants a locale, e.g. en_US.UTF-8}
		# locale -a spells the codeset in lower case without its dash (en_US.utf8)
		want=$(printf %s "$locale" | tr 'A-Z' 'a-z' | sed 's/utf-8$/utf8/')
		locale -a | tr 'A-Z' 'a-z' | grep -qx "$want" || {
			echo "cost: locale $locale is not installed here (locale -a); make it with: localedef -i ${locale%%.*} -f UTF-8 $locale" >&2
			exit 2
		}
		shift 2
		;;
	--*)
		echo "cost: unknown flag $1 (want --batch N, --group N, --locale L)" >&2
		exit 2
		;;
	*) break ;;
	esac
done
for f in "$@"; do
	[ -r "$f" ] || {
		echo "cost: cannot read variant $f" >&2
		exit 2
	}
done
command -v valgrind >/dev/null || {
	echo "cost: valgrind is not installed (apt-get install valgrind)" >&2
	exit 1
}
. "$(dirname "$0")/callgrind-server.sh"
callgrind_dir
export PGOPTIONS='-c client_min_messages=warning'

(cd "$root" && go build -o "$dir/costprobe" ./bench/cmd/costprobe)
callgrind_start "$locale" -c max_connections=20
psql -q -v ON_ERROR_STOP=1 "$url/postgres" -c 'CREATE DATABASE cost_template' >/dev/null
"$dbmate" --url "$url/cost_template?sslmode=disable" --migrations-dir "$root/schema" --no-dump-schema up >/dev/null
# History: 50,000 events x push and sms, SENT with their accepted attempt, written as the owner (the
# attempt's fit with its task is for the protocol's own moves; history is loaded as it stands).
psql -q -v ON_ERROR_STOP=1 "$url/cost_template" >/dev/null <<'SQL'
ALTER TABLE delivery_attempt DISABLE TRIGGER USER;
INSERT INTO channel_pref (user_id, channel, address, enabled)
SELECT 'u' || g, c, 'a' || g, true FROM generate_series(1, 1000) g, unnest(ARRAY['push', 'sms']) c;
INSERT INTO notification (user_id, event_key, body, expires_at)
SELECT 'u' || (g % 1000 + 1), 'history-' || g, 'hello ' || g, now() + interval '1 hour' FROM generate_series(1, 50000) g;
INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, attempt_token, next_attempt_at, provider_msg_id)
SELECT n.id, c, 'SENT', 1, 5, gen_random_uuid(), NULL, 'p-' || n.id || c FROM notification n, unnest(ARRAY['push', 'sms']) c;
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, provider_msg_id)
SELECT id, 1, attempt_token, 'SEND', 'history', now(), 'ACCEPTED', provider_msg_id FROM delivery_task;
ALTER TABLE delivery_attempt ENABLE TRIGGER USER;
VACUUM ANALYZE;
SQL

# instructions EVENTS: the instructions of the claiming backend of one costprobe run.
instructions() {
	backend=$(DATABASE_URL="$url/cost?sslmode=disable" "$dir/costprobe" --print-pid --notifications "$1" $probe_flags | awk '/^pid /{print $2}')
	for _ in $(seq 120); do # callgrind writes the file when the backend exits
		grep -q '^totals:' "$dir/cg.$backend" 2>/dev/null && break
		sleep 1
	done
	awk '/^totals:/{print $2}' "$dir/cg.$backend"
}

echo "instructions per delivery (costprobe${probe_flags:- --batch 200 --group 25}, locale $locale)"
[ $# -eq 0 ] && set -- ""
for variant in "$@"; do
	psql -q "$url/postgres" -c 'DROP DATABASE IF EXISTS cost' -c 'CREATE DATABASE cost TEMPLATE cost_template' >/dev/null
	[ -n "$variant" ] && psql -q -v ON_ERROR_STOP=1 "$url/cost" -f "$variant" >/dev/null
	small=$(instructions 500)
	large=$(instructions 1500)
	awk -v s="$small" -v l="$large" -v name="${variant:-schema/ as it is}" \
		'BEGIN { printf "%-40s %9.0f\n", name, (l - s) / 2000 }'
done
