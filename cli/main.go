// Package cli is the notifier command: the operator's and the scheduler's entry point to the notifier
// service. It sets preferences, submits events, runs delivery workers, lists and resolves parked tasks,
// reports status, and serves the fake channels for local runs. The binary is cli/notifier.
//
// Results are JSON on stdout; logs (slog) and the one-line error go to stderr. Exit codes: 0 ok,
// 1 runtime error (database down, ...), 2 usage or bad input, 3 nothing changed (show: nothing found).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/redact"
)

// Exit codes of every command.
const (
	exitOK        = 0
	exitRuntime   = 1 // the database is unreachable, a query failed, the user lacks the command's role, ...
	exitUsage     = 2 // unknown command or flag, missing or bad value, input the service refuses
	exitUnchanged = 3 // the command was valid but changed nothing (e.g. resolve of a task not parked), or show found nothing
)

// Run executes one command line (args[0] is the program's name). It writes results to stdout and, when
// it fails, one line "notifier: ..." to stderr, with any URL password removed. ExitCode maps its error
// to the process's exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	err := newApp(e).RunContext(ctx, args)
	if err != nil {
		err = service.ExplainPooler(err, e.dbUser) // a pooler's configuration: say the fix
		fmt.Fprintln(stderr, "notifier: "+errorLine(err, e.dbURL, e.secret))
	}
	return err
}

// usageError is a command line or input the program refuses: exit 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// unchangedError is a valid command that changed nothing: exit 3.
type unchangedError struct{ msg string }

func (e *unchangedError) Error() string { return e.msg }

// ExitCode is the exit code for Run's error.
func ExitCode(err error) int {
	var (
		usage     *usageError
		unchanged *unchangedError
		exitCoder cli.ExitCoder // only urfave's own usage errors ("No help topic ..."); we never create one
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &unchanged):
		return exitUnchanged
	case errors.As(err, &usage), errors.Is(err, delivery.ErrInvalidInput), errors.As(err, &exitCoder):
		return exitUsage
	default:
		return exitRuntime
	}
}

// errorLine is err as one line, without passwords: any URL's or password=...'s (service/redact), and
// the database's wherever it appears, in every form the database URL may hold it.
func errorLine(err error, dbURL, secret string) string {
	s := err.Error()
	if connErr := (*pgconn.ConnectError)(nil); errors.As(err, &connErr) && !errors.Is(err, service.ErrPooler) {
		s = "database unreachable: " + s
	}
	s = redact.Known(redact.Scrub(s, dbURL), secret)
	// pgx reports one line per connection attempt, often the same one twice (sslmode=prefer).
	var lines []string
	seen := map[string]bool{}
	for _, l := range strings.Split(s, "\n") {
		l = strings.Join(strings.Fields(l), " ")
		if l != "" && !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	switch len(lines) {
	case 0:
		return "error"
	case 1:
		return lines[0]
	}
	return lines[0] + " " + strings.Join(lines[1:], "; ")
}
