# Sourced by bench/vs-river.sh and bench/variant.sh: pin_server NAME moves the PostgreSQL server of
# $DATABASE_URL (the postmaster and every backend, which inherit it) onto core 0, and sets $client to the
# command prefix that runs a bench on the other cores (taskset) and $cores to the machine's count. The
# server must run on this machine and be ours to move (a throwaway cluster). NAME prefixes its errors;
# it exits 2 on a machine of one core and 1 when no server process is found.
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
