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
	Resend  string `json:"resend,omitempty"` // with --resend
}

func fakeCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "fake",
		Usage:     "serve the fake push, sms and none channels for local runs and tests",
		UsageText: "notifier fake [--listen 127.0.0.1:0] [--resend 127.0.0.1:17025]",
		Description: `Starts the three fake channels (push: idempotent, sms: queryable, none: neither), each on
127.0.0.1 with a free port, and their control API on --listen:
  POST /control/{push|sms|none}/script  {"ref":"task-1","target":"send"|"query","steps":[{"delay_ms":1200}]}
  GET  /control/{push|sms|none}/counts, GET /control/counts
A step is {"status":N,"retry_after":"S"} (answered before acceptance), or, after acceptance is
recorded, any of "delay_ms", "hang", "malformed", "slow_body_ms", or "drop": true (close the
connection without an answer).
With --resend ADDR it also serves a fake of Resend's email API on ADDR (POST /emails, as
docs/channels.md#resend describes), accepting the API key in the environment variable named by
--resend-key-env (RESEND_API_KEY): a channels file of kind "resend" with base_url "http://ADDR" runs
against it.
Needs no database.

Prints one JSON line on stdout once everything listens, then serves until SIGTERM or SIGINT
(exit 0):
  {"push":"http://127.0.0.1:...","sms":"http://...","none":"http://...","control":"http://...","resend":"http://..."}

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "address of the control API (port 0: a free port)"},
			&cli.StringFlag{Name: "resend", Usage: "also serve the Resend fake on this address (host:port)"},
			&cli.StringFlag{Name: "resend-key-env", Value: "RESEND_API_KEY", Usage: "environment variable holding the API key the Resend fake accepts"},
		},
		Action: func(c *cli.Context) error {
			return serveFakes(c.Context, e, c.String("listen"), c.String("resend"), c.String("resend-key-env"))
		},
	}
}

func serveFakes(ctx context.Context, e *env, listen, resendAddr, resendKeyEnv string) error {
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return usagef("invalid --listen %q: want host:port, e.g. 127.0.0.1:0", listen)
	}
	var resendKey string
	if resendAddr != "" {
		if _, _, err := net.SplitHostPort(resendAddr); err != nil {
			return usagef("invalid --resend %q: want host:port, e.g. 127.0.0.1:17025", resendAddr)
		}
		if resendKey = e.getenv(resendKeyEnv); resendKey == "" {
			return usagef("--resend: environment variable %s (--resend-key-env) is unset or empty: the fake needs the API key it accepts", resendKeyEnv)
		}
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
	var resendURL string
	if resendAddr != "" {
		r, err := fakes.StartResendOn(resendKey, resendAddr)
		if err != nil {
			return err
		}
		defer r.Close()
		resendURL = r.URL()
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	srv := &http.Server{Handler: fakes.ControlHandler(channels...), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	out := fakeOutput{Push: channels[0].URL(), SMS: channels[1].URL(), None: channels[2].URL(), Control: "http://" + l.Addr().String(), Resend: resendURL}
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
