# Sourced by bench/vs-river.sh and bench/variant.sh, which both run interleaved rounds, optionally with
# the server pinned to a core of its own.
#
# rounds_and_pin NAME ARGS... reads the leading --rounds N and --pin of ARGS: it sets $rounds (left as
# the caller set it when absent) and $pin (0 or 1), and $flags_taken to how many arguments they were, for
# the caller to shift. An unknown flag exits 2 naming it; NAME prefixes the errors. Each caller checks
# the count itself (their lowest differs).
rounds_and_pin() {
	caller=$1
	shift
	pin=0
	flags_taken=0
	while [ $# -gt 0 ]; do
		case $1 in
		--rounds)
			rounds=${2:?--rounds wants a count}
			shift 2
			flags_taken=$((flags_taken + 2))
			;;
		--pin)
			pin=1
			shift
			flags_taken=$((flags_taken + 1))
			;;
		--*)
			echo "$caller: unknown flag $1 (want --rounds N, --pin)" >&2
			exit 2
			;;
		*) break ;;
		esac
	done
}

# pin_server NAME moves the PostgreSQL server of $DATABASE_URL (the postmaster and every backend, which
# inherit it) onto core 0, and sets $client to the command prefix that runs a bench on the other cores
# (taskset) and $cores to the machine's count. The server must run on this machine and be ours to move
# (a throwaway cluster). NAME prefixes its errors; it exits 2 on a machine of one core and 1 when no
# server process is found.
pin_server() {
	cores=$(nproc)
	if [ "$cores" -lt 2 ]; then
		echo "$1: --pin needs at least 2 cores, this machine has $cores" >&2
		exit 2
	fi
	# The checkpointer lives as long as the server; its parent is the postmaster.
	checkpointer=$(psql "$DATABASE_URL" -Atqc "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")
	postmaster=$(ps -o ppid= -p "$checkpointer" | tr -d ' ')
	[ -n "$postmaster" ] || {
		echo "$1: --pin: no PostgreSQL server process found on this machine" >&2
		exit 1
	}
	taskset -a -p -c 0 "$postmaster" >/dev/null
	for pid in $(pgrep -P "$postmaster"); do
		taskset -a -p -c 0 "$pid" >/dev/null
	done
	client="taskset -c 1-$((cores - 1))"
}
