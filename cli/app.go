package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/redact"
)

// env is what a command line runs with: the process's environment and streams, and what the global
// flags set up.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	log       *slog.Logger
	dbURL     string
	dbTimeout time.Duration
	dbUser    string // the login role, named in the fixes of a pooler's refusals
	secret    string // the database password, scrubbed from error lines
}

const exitCodesHelp = `Exit codes: 0 ok; 1 runtime error (database unreachable, query failed, the database user
lacks the command's role, ...); 2 usage or bad input (unknown command or flag, missing or bad value,
input the service refuses); 3 nothing changed (resolve, cancel; create never: a duplicate is exit 0
with created=false) or nothing found (show).`

const rootDescription = `Submits notification events, runs delivery workers and lets an operator review and resolve
deliveries whose outcome is unknown. Every command that talks to PostgreSQL needs --database-url
(or DATABASE_URL); global options go before the command.

Results are JSON on stdout (one object, or one object per line for lists); logs go to stderr
(--log-format, --log-level). A failure prints one line "notifier: ..." on stderr; a database
password is never printed.

` + exitCodesHelp

func newApp(e *env) *cli.App {
	app := &cli.App{
		Name:                      "notifier",
		Usage:                     "deliver notifications once per event, with honest handling of unknown outcomes",
		UsageText:                 "notifier [global options] command [command options]",
		Description:               rootDescription,
		HideVersion:               true,
		Reader:                    e.stdin,
		Writer:                    e.stdout,
		ErrWriter:                 e.stderr,
		DisableSliceFlagSeparator: true, // --channel values contain commas
		ExitErrHandler:            func(*cli.Context, error) {},
		OnUsageError:              onUsageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "database-url", Usage: "PostgreSQL URL (default: $DATABASE_URL)"},
			&cli.DurationFlag{Name: "db-timeout", Value: 10 * time.Second, Usage: "bound on each database call"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format on stderr: text or json"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		},
		Before: e.before,
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("unknown command %q (see notifier --help)", c.Args().First())
			}
			return usagef("no command given (see notifier --help)")
		},
		Commands: []*cli.Command{
			prefCommand(e),
			createCommand(e),
			cancelCommand(e),
			workCommand(e),
			receiptsCommand(e),
			resolveCommand(e),
			reviewCommand(e),
			showCommand(e),
			statusCommand(e),
			consoleCommand(e),
			pruneCommand(e),
			fakeCommand(e),
			demoCommand(e),
		},
	}
	for _, c := range app.Commands {
		setupCommand(c)
	}
	return app
}

// setupCommand makes every command report bad flags as usage errors (exit 2, one line) instead of
// printing its help, and refuse positional arguments it does not take.
func setupCommand(c *cli.Command) {
	c.OnUsageError = onUsageError
	c.HideHelpCommand = true
	if c.Action == nil {
		name := c.Name
		c.Action = func(ctx *cli.Context) error {
			if ctx.Args().Present() {
				return usagef("unknown command %q for %s (see notifier %s --help)", ctx.Args().First(), name, name)
			}
			return usagef("%s needs a subcommand (see notifier %s --help)", name, name)
		}
	} else {
		action := c.Action
		c.Action = func(ctx *cli.Context) error {
			if ctx.Args().Present() {
				return usagef("%s: unexpected argument %q", commandName(ctx), ctx.Args().First())
			}
			return action(ctx)
		}
	}
	for _, sub := range c.Subcommands {
		setupCommand(sub)
	}
}

func onUsageError(c *cli.Context, err error, _ bool) error {
	if name := commandName(c); name != "" {
		return &usageError{err: fmt.Errorf("%s: %w", name, err)}
	}
	return &usageError{err: err}
}

// commandName is the command path without the program name ("pref set"), "" at the root.
func commandName(c *cli.Context) string {
	if c.Command == nil {
		return ""
	}
	name, _ := strings.CutPrefix(c.Command.HelpName, "notifier")
	return strings.TrimSpace(name)
}

// before applies the global flags.
func (e *env) before(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return usagef("invalid --log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.String("log-format")) {
	case "text":
		e.log = slog.New(slog.NewTextHandler(e.stderr, opts))
	case "json":
		e.log = slog.New(slog.NewJSONHandler(e.stderr, opts))
	default:
		return usagef("invalid --log-format %q: want text or json", c.String("log-format"))
	}
	e.dbTimeout = c.Duration("db-timeout")
	if e.dbTimeout <= 0 {
		return usagef("invalid --db-timeout %s: must be more than 0", e.dbTimeout)
	}
	e.dbURL = c.String("database-url")
	if e.dbURL == "" {
		e.dbURL = e.getenv("DATABASE_URL")
	}
	return nil
}

// pool opens a connection pool. It connects lazily: a command's first query reports an unreachable
// database, after the service has checked the input.
func (e *env) pool(maxConns int32) (*pgxpool.Pool, error) { return e.newPool(maxConns, false) }

// workerPool is pool for commands that run the dispatcher: its connections plan the worker's prepared
// statements once (service.ConfigureWorkerConn).
func (e *env) workerPool(maxConns int32) (*pgxpool.Pool, error) { return e.newPool(maxConns, true) }

func (e *env) newPool(maxConns int32, worker bool) (*pgxpool.Pool, error) {
	if e.dbURL == "" {
		return nil, usagef("no database: set --database-url or DATABASE_URL")
	}
	cfg, err := service.ParsePoolConfig(e.dbURL)
	if err != nil {
		return nil, &usageError{err: err}
	}
	if redact.Misread(e.dbURL, cfg.ConnConfig.Password) {
		// pgx read the URL otherwise than the conservative reading: its password holds an unescaped
		// '@', '/', '?', '#' or space, so pgx would connect with part of it as a host or database name,
		// and every error would quote that part.
		return nil, usagef("invalid database URL: its password holds a character a URL needs percent-encoded (an at sign, slash, question mark, hash or space: %%40, %%2F, %%3F, %%23, %%20), or set PGPASSWORD instead: %s",
			redact.URL(e.dbURL))
	}
	e.secret, e.dbUser = cfg.ConnConfig.Password, cfg.ConnConfig.User
	if maxConns > cfg.MaxConns {
		cfg.MaxConns = maxConns
	}
	if worker {
		service.ConfigureWorkerConn(cfg.ConnConfig)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	e.log.Debug("database", "host", cfg.ConnConfig.Host, "port", cfg.ConnConfig.Port,
		"database", cfg.ConnConfig.Database, "user", cfg.ConnConfig.User)
	return pool, nil
}

// dbContext bounds one database call.
func (e *env) dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.dbTimeout)
}

// printJSON writes v as one line of JSON on stdout.
func (e *env) printJSON(v any) error {
	if err := json.NewEncoder(e.stdout).Encode(v); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// required reports the first of names not given on the command line. It replaces urfave's Required,
// which prints the whole help on stdout.
func required(c *cli.Context, names ...string) error {
	for _, name := range names {
		if !c.IsSet(name) {
			return usagef("%s: missing required flag --%s", commandName(c), name)
		}
	}
	return nil
}
