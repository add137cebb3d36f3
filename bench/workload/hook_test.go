package workload

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --phase-hook CMD runs CMD through the shell with the phase appended, and a failing command is an
// error naming the phase.
func TestShellHook(t *testing.T) {
	if ShellHook("", nil) != nil {
		t.Fatal("no command: want no hook")
	}
	file := filepath.Join(t.TempDir(), "marks")
	var out bytes.Buffer
	hook := ShellHook("echo >>'"+file+"' marked", &out)
	for _, phase := range []string{"start", "end"} {
		if err := hook(context.Background(), phase); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "marked start\nmarked end\n" {
		t.Errorf("the hook wrote %q, want the phases appended in turn", got)
	}
	err = ShellHook("echo failing; exit 3", &out)(context.Background(), "end")
	if err == nil || !strings.Contains(err.Error(), "--phase-hook end") {
		t.Errorf("a failing hook: want an error naming its phase, got %v", err)
	}
	if !strings.Contains(out.String(), "failing") {
		t.Errorf("the hook's output: want it on out, got %q", out.String())
	}
}
