package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// Exit codes: 2 and one line for a bad flag (the load run's and compare's), 0 for --help.
func TestExitCodes(t *testing.T) {
	is := is.New(t)
	noEnv := func(string) string { return "" }
	for _, args := range [][]string{{"--nope"}, {"--workers", "0"}, {"compare"}, {"compare", "--nope"}} {
		var stderr bytes.Buffer
		code := run(context.Background(), args, noEnv, &bytes.Buffer{}, &stderr)
		is.Equal(code, 2)                                                    // a usage error
		is.Equal(strings.Count(strings.TrimSpace(stderr.String()), "\n"), 0) // said in one line
		is.True(strings.HasPrefix(stderr.String(), "bench: "))               // naming the program
	}
	var stderr bytes.Buffer
	is.Equal(run(context.Background(), []string{"--help"}, noEnv, &bytes.Buffer{}, &stderr), 0)                               // help is no error
	is.True(strings.Contains(stderr.String(), "--call-latency") || strings.Contains(stderr.String(), "-call-latency"))        // and lists the flags
	is.Equal(run(context.Background(), []string{"compare", "/nonexistent.json"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{}), 1) // a report that cannot be read
}
