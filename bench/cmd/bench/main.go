// Command bench is notifier's load bench (bench/load): it creates events and delivers them with the
// product's worker loop against in-process fake channels answering by a latency model, beside pgbench
// replaying the same SQL; `bench compare` sets its JSON reports beside the River peer's (bench/river).
//
//	sh internal/tools/just bench [flags]                 # on a throwaway cluster
//	DATABASE_URL=postgres://... go run ./bench/cmd/bench [flags]
//	go run ./bench/cmd/bench compare ours=ours.json river=river.json
//
// Exit codes: 0 ok; 1 a runtime error or a failed final check; 2 a bad flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/notifierhq/notifier/bench/compare"
	"github.com/notifierhq/notifier/bench/load"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // after the first signal, a second one terminates at once
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && args[0] == "compare" {
		err = compare.Main(args[1:], stdout, stderr)
	} else {
		err = load.Main(ctx, args, getenv, stdout, stderr)
	}
	var (
		usage    *load.UsageError
		cmpUsage *compare.UsageError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage), errors.As(err, &cmpUsage):
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	default: // a runtime error, or a failed final check (*load.CheckError; the report says which)
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
}
