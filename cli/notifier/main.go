// Command notifier delivers notifications once per event, with honest handling of unknown outcomes:
// `notifier --help` lists its commands (package cli holds them).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/notifierhq/notifier/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	context.AfterFunc(ctx, stop) // after the first signal, a second one terminates at once
	os.Exit(cli.ExitCode(cli.Run(ctx, os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr)))
}
