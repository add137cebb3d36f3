package docscheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/cli"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/channelconfig"
)

// The names a user meets in the docs are the code's: every command of the binary has its row in
// README's command table, every role the migrations create is named in README and has its row in
// docs/operations.md's roles table, every channel kind is named in docs/channels.md, and no doc counts
// the roles wrong. A command, role or kind added without its docs fails here.

// commandNames are the commands `notifier --help` lists, with pref's subcommand: what README's table
// must have a row for.
func commandNames(t *testing.T) []string {
	t.Helper()
	var out bytes.Buffer
	err := cli.Run(context.Background(), []string{"notifier", "--help"}, func(string) string { return "" }, strings.NewReader(""), &out, &out)
	if err != nil {
		t.Fatalf("notifier --help: %v", err)
	}
	_, list, ok := strings.Cut(out.String(), "COMMANDS:\n")
	if !ok {
		t.Fatalf("notifier --help lists no COMMANDS:\n%s", out.String())
	}
	var names []string
	for _, line := range strings.Split(list, "\n") {
		if !strings.HasPrefix(line, "   ") || strings.TrimSpace(line) == "" {
			break
		}
		name := strings.Fields(line)[0]
		name = strings.TrimSuffix(name, ",")
		switch name {
		case "help": // urfave/cli's own
			continue
		case "pref":
			name = "pref set"
		}
		names = append(names, name)
	}
	return names
}

func TestDocsNameTheCommandsRolesAndKinds(t *testing.T) {
	is := is.New(t)
	root := repoRoot(t)
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		is.NoErr(err) // the doc exists
		return string(b)
	}
	readme, operations, channels := read("README.md"), read("docs/operations.md"), read("docs/channels.md")
	commands := commandNames(t)
	is.True(len(commands) >= 10)                                                                   // the binary's commands were listed
	is.Equal(missing(commands, func(c string) string { return "| `" + c }, readme), []string(nil)) // each command has its row in README

	roles := []string{service.RoleCreator, service.RoleWorker, service.RoleOperator, service.RoleReceiver}
	is.Equal(missing(roles, func(r string) string { return "`" + r + "`" }, readme), []string(nil))         // README names each role
	is.Equal(missing(roles, func(r string) string { return "| `" + r + "` |" }, operations), []string(nil)) // operations.md has its row
	is.Equal(wrongRoleCounts(t, root, len(roles)), []string(nil))                                           // and nothing counts them wrong

	is.Equal(missing(channelconfig.Kinds(), func(k string) string { return "`" + k + "`" }, channels), []string(nil)) // channels.md names each kind
}

// missing lists the names whose form is not in doc.
func missing(names []string, form func(string) string, doc string) []string {
	var out []string
	for _, n := range names {
		if !strings.Contains(doc, form(n)) {
			out = append(out, n)
		}
	}
	return out
}

var numberWords = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}

// roleCount finds "three roles", "the four least-privilege roles" and the like.
var roleCount = regexp.MustCompile(`(?i)\b(zero|one|two|three|four|five|six|seven|eight|nine)\s+(least-privilege\s+)?roles\b`)

// wrongRoleCounts lists every place in README and docs/ (the dated benchmark records aside: they say
// what was true then) that counts the roles as other than want.
func wrongRoleCounts(t *testing.T, root string, want int) []string {
	t.Helper()
	var out []string
	for _, rel := range markdownFiles(t, root) {
		if strings.HasPrefix(rel, "docs/benchmarks/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range roleCount.FindAllStringSubmatch(string(b), -1) {
			if !strings.EqualFold(m[1], numberWords[want]) {
				out = append(out, fmt.Sprintf("%s: %q", rel, m[0]))
			}
		}
	}
	return out
}

// TestNameChecksCanFail is the negative control of the checks above.
func TestNameChecksCanFail(t *testing.T) {
	is := is.New(t)
	is.Equal(missing([]string{"show", "frobnicate"}, func(c string) string { return "| `" + c }, "| `show {--user U}` |"), []string{"frobnicate"}) // a command without its row
	dir := t.TempDir()
	is.NoErr(os.Mkdir(filepath.Join(dir, "docs"), 0o755))
	is.NoErr(os.WriteFile(filepath.Join(dir, "README.md"), []byte("# x\n\nThe three least-privilege roles, and four roles.\n"), 0o644))
	is.Equal(wrongRoleCounts(t, dir, 4), []string{`README.md: "three least-privilege roles"`}) // a wrong count is found, a right one is not
}
