package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/fakes"
)

// fakeOutput is the line fake prints once its servers listen.
type fakeOutput struct {
	Push    string `json:"push"`
	SMS     string `json:"sms"`
	None    string `json:"none"`
	Control string `json:"control"`
}

func fakeCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "fake",
		Usage:     "serve the fake push, sms and none channels for local runs and tests",
		UsageText: "notifier fake [--listen 127.0.0.1:0]",
		Description: `Starts the three fake channels (push: idempotent, sms: queryable, none: neither), each on
127.0.0.1 with a free port, and their control API on --listen:
  POST /control/{push|sms|none}/script  {"ref":"task-1","target":"send"|"query","steps":[{"delay_ms":1200}]}
  GET  /control/{push|sms|none}/counts, GET /control/counts
A step is {"status":N,"retry_after":"S"} (answered before acceptance), or, after acceptance is
recorded, any of "delay_ms", "hang", "malformed", "slow_body_ms", or "drop": true (close the
connection without an answer).
Needs no database.

Prints one JSON line on stdout once everything listens, then serves until SIGTERM or SIGINT
(exit 0):
  {"push":"http://127.0.0.1:...","sms":"http://...","none":"http://...","control":"http://..."}

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "address of the control API (port 0: a free port)"},
		},
		Action: func(c *cli.Context) error { return serveFakes(c.Context, e, c.String("listen")) },
	}
}

func serveFakes(ctx context.Context, e *env, listen string) error {
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return usagef("invalid --listen %q: want host:port, e.g. 127.0.0.1:0", listen)
	}
	var channels []*fakes.Channel
	defer func() {
		for _, ch := range channels {
			ch.Close()
		}
	}()
	for _, kind := range []fakes.Kind{fakes.Push, fakes.SMS, fakes.None} {
		ch, err := fakes.StartOn(kind, "127.0.0.1:0")
		if err != nil {
			return err
		}
		channels = append(channels, ch)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	srv := &http.Server{Handler: fakes.ControlHandler(channels...), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	out := fakeOutput{Push: channels[0].URL(), SMS: channels[1].URL(), None: channels[2].URL(), Control: "http://" + l.Addr().String()}
	if err := e.printJSON(out); err != nil {
		_ = srv.Close()
		return err
	}
	if f, ok := e.stdout.(interface{ Flush() error }); ok {
		_ = f.Flush() // os.Stdout is unbuffered; a buffered writer is flushed so a reader sees the line now
	}
	e.log.Info("serving fakes", "push", out.Push, "sms", out.SMS, "none", out.None, "control", out.Control)

	select {
	case <-ctx.Done():
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("control API: %w", err)
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	e.log.Info("fakes stopped")
	return nil
}
