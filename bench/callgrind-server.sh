# Sourced by bench/cost.sh and bench/cost-vs-river.sh: one throwaway PostgreSQL 15 under valgrind's
# callgrind, every process it forks counted (--trace-children=yes), each process's profile written to
# $dir/cg.PID when it exits. As root, the server runs as nobody.
#
#   callgrind_dir                        sets root, pgbin, dbmate ($DBMATE), as, dir (a new directory)
#                                        and the traps that stop the server and remove $dir at exit
#   callgrind_start LOCALE [-c NAME=VALUE...]
#                                        initdb, start postgres under callgrind (autovacuum off), and
#                                        set pid and url once it answers

callgrind_dir() {
	pgbin=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
	[ -x "$pgbin/postgres" ] || pgbin=/usr/lib/postgresql/15/bin
	dbmate=${DBMATE:-dbmate}
	root=$(cd "$(dirname "$0")/.." && pwd)
	dir=$(mktemp -d)
	as=
	if [ "$(id -u)" = 0 ]; then
		as="runuser -u nobody --"
		chown nobody "$dir"
	fi
	pid=
	trap callgrind_cleanup EXIT
	trap 'exit 130' INT TERM
}

callgrind_cleanup() {
	status=$?
	if [ -n "$pid" ]; then
		# pg_ctl waits for every backend to exit, and wait for the postmaster's valgrind to write its
		# last profile: killing runuser instead left them writing into $dir while rm emptied it
		# ("Directory not empty", and the script exited 1 after printing its figures).
		$as "$pgbin/pg_ctl" -D "$dir/data" -m fast -w -t 300 stop >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
	exit "$status"
}

callgrind_start() {
	locale=$1
	shift
	port=$((20000 + $$ % 10000))
	$as "$pgbin/initdb" -D "$dir/data" -A trust -U postgres --locale="$locale" >/dev/null
	# --vgdb=no: nothing here attaches a debugger, and the gdbserver's polling is not the server's work.
	$as valgrind --tool=callgrind --trace-children=yes --vgdb=no --callgrind-out-file="$dir/cg.%p" \
		"$pgbin/postgres" -D "$dir/data" -c port=$port -c listen_addresses=127.0.0.1 -c unix_socket_directories="$dir" \
		-c autovacuum=off -c shared_buffers=128MB "$@" >"$dir/server.log" 2>&1 &
	pid=$!
	url="postgres://postgres@127.0.0.1:$port"
	for _ in $(seq 120); do
		psql -q "$url/postgres" -c 'SELECT 1' >/dev/null 2>&1 && return 0
		sleep 1
	done
	echo "$(basename "$0"): the server under callgrind did not answer within 120 s ($dir/server.log):" >&2
	tail -5 "$dir/server.log" >&2
	exit 1
}
