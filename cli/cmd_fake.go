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
	Push     string `json:"push"`
	SMS      string `json:"sms"`
	None     string `json:"none"`
	Control  string `json:"control"`
	Resend   string `json:"resend,omitempty"`   // with --resend
	Postmark string `json:"postmark,omitempty"` // with --postmark
}

func fakeCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:        "fake",
		Usage:       "serve the fake push, sms and none channels for local runs and tests",
		UsageText:   "notifier fake [--listen 127.0.0.1:0] [--resend 127.0.0.1:17025] [--postmark 127.0.0.1:17026]",
		Description: helpText("fake"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "address of the control API (port 0: a free port)"},
			&cli.StringFlag{Name: "resend", Usage: "also serve the Resend fake on this address (host:port)"},
			&cli.StringFlag{Name: "resend-key-env", Value: "RESEND_API_KEY", Usage: "environment variable holding the API key the Resend fake accepts"},
			&cli.StringFlag{Name: "postmark", Usage: "also serve the Postmark fake on this address (host:port)"},
			&cli.StringFlag{Name: "postmark-token-env", Value: "POSTMARK_SERVER_TOKEN", Usage: "environment variable holding the server token the Postmark fake accepts"},
		},
		Action: func(c *cli.Context) error {
			return serveFakes(c.Context, e, c.String("listen"), providerFakes{
				resendAddr: c.String("resend"), resendKeyEnv: c.String("resend-key-env"),
				postmarkAddr: c.String("postmark"), postmarkTokenEnv: c.String("postmark-token-env")})
		},
	}
}

// providerFakes are the provider API fakes `notifier fake` serves besides the channel fakes.
type providerFakes struct {
	resendAddr, resendKeyEnv       string
	postmarkAddr, postmarkTokenEnv string
}

// providerSecret checks a provider fake's address and reads the credential it accepts ("" when the
// fake is not asked for).
func providerSecret(e *env, flag, addr, envFlag, envName string) (string, error) {
	if addr == "" {
		return "", nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", usagef("invalid --%s %q: want host:port, e.g. 127.0.0.1:17025", flag, addr)
	}
	v := e.getenv(envName)
	if v == "" {
		return "", usagef("--%s: environment variable %s (--%s) is unset or empty: the fake needs the credential it accepts", flag, envName, envFlag)
	}
	return v, nil
}

func serveFakes(ctx context.Context, e *env, listen string, pf providerFakes) error {
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return usagef("invalid --listen %q: want host:port, e.g. 127.0.0.1:0", listen)
	}
	resendKey, err := providerSecret(e, "resend", pf.resendAddr, "resend-key-env", pf.resendKeyEnv)
	if err != nil {
		return err
	}
	postmarkToken, err := providerSecret(e, "postmark", pf.postmarkAddr, "postmark-token-env", pf.postmarkTokenEnv)
	if err != nil {
		return err
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
	var resendURL, postmarkURL string
	if pf.resendAddr != "" {
		r, err := fakes.StartResendOn(resendKey, pf.resendAddr)
		if err != nil {
			return err
		}
		defer r.Close()
		resendURL = r.URL()
	}
	if pf.postmarkAddr != "" {
		p, err := fakes.StartPostmarkOn(postmarkToken, pf.postmarkAddr)
		if err != nil {
			return err
		}
		defer p.Close()
		postmarkURL = p.URL()
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	srv := &http.Server{Handler: fakes.ControlHandler(channels...), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	out := fakeOutput{Push: channels[0].URL(), SMS: channels[1].URL(), None: channels[2].URL(), Control: "http://" + l.Addr().String(), Resend: resendURL, Postmark: postmarkURL}
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
