# Sourced by internal/tools/install-gremlins and install-staticcheck (not run by itself): installs
# the Go command $tool_pkg at $tool_version into <repo>/.tools/bin/$tool_name with `go install`
# (GOBIN), unless the binary there was already built from that module version, then prints its path
# on stdout. Progress goes to stderr. The caller sets tool_name, tool_module, tool_pkg, tool_version
# and script_dir. The version is read from the binary's build information (`go version -m`), since
# neither tool reports its module version itself.

die() {
	printf 'internal/tools/install-%s: %s\n' "$tool_name" "$*" >&2
	exit 1
}

root=$(CDPATH='' cd -- "$script_dir/../.." && pwd -P) || die "cannot locate the repository root"
[ -f "$root/go.mod" ] || die "no go.mod in $root (expected the script at <repo>/internal/tools/)"
command -v go >/dev/null 2>&1 || die "go not found in PATH: install Go (see go.mod for the version)"
bin=$root/.tools/bin
exe=$bin/$tool_name

# built_version prints the module version $exe was built from, if it was built from $tool_module.
built_version() {
	go version -m "$exe" 2>/dev/null | awk -v m="$tool_module" '$1 == "mod" && $2 == m { print $3 }'
}

if [ -x "$exe" ] && [ "$(built_version)" = "$tool_version" ]; then
	printf '%s\n' "$exe"
	exit 0
fi

echo "internal/tools/install-$tool_name: installing $tool_pkg@$tool_version into .tools/bin" >&2
mkdir -p "$bin"
# Built with the module proxy defaults, outside of this module's go.mod.
if ! (cd "$bin" && GOBIN=$bin GOFLAGS='' go install "$tool_pkg@$tool_version" >&2); then
	die "go install $tool_pkg@$tool_version failed (see output above)"
fi
got=$(built_version)
[ "$got" = "$tool_version" ] || die "$exe was built from '$got', expected $tool_module $tool_version"
printf '%s\n' "$exe"
