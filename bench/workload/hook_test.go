package workload

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// --phase-hook CMD runs CMD through the shell with the phase appended, and a failing command is an
// error naming the phase.
func TestShellHook(t *testing.T) {
	is := is.New(t)
	is.True(ShellHook("", nil) == nil) // no command: no hook
	file := filepath.Join(t.TempDir(), "marks")
	var out bytes.Buffer
	hook := ShellHook("echo >>'"+file+"' marked", &out)
	for _, phase := range []string{"start", "end"} {
		is.NoErr(hook(context.Background(), phase))
	}
	got, err := os.ReadFile(file)
	is.NoErr(err)
	is.Equal(string(got), "marked start\nmarked end\n") // the phases appended in turn

	err = ShellHook("echo failing; exit 3", &out)(context.Background(), "end")
	is.True(err != nil && strings.Contains(err.Error(), "--phase-hook end")) // a failing hook's error names its phase
	is.True(strings.Contains(out.String(), "failing"))                       // the hook's output goes to out
}
