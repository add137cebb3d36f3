package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/receipts"
	"github.com/notifierhq/notifier/service/webhook"
)

func receiptsCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "receipts",
		Usage: "receive signed delivery callbacks from providers; receipts settle unknown outcomes as SENT",
		UsageText: "notifier receipts --listen ADDR {--webhook-secret-env NAME | --webhook-secret-file F ... |\n" +
			"   --twilio-token-env NAME | --twilio-token-file F --public-url URL |\n" +
			"   --postmark-user U --postmark-password-env NAME | --postmark-header H --postmark-header-value-env NAME |\n" +
			"   --ses-topic-arn ARN ...}\n" +
			"   [--disable-on-bounce] [--sweep 5s] [--tolerance 5m]",
		Description: helpText("receipts"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "address to serve on, e.g. 127.0.0.1:8088 (required)"},
			&cli.StringSliceFlag{Name: "webhook-secret-env", Usage: "environment variable holding a Standard Webhooks secret (repeatable)"},
			&cli.StringSliceFlag{Name: "webhook-secret-file", Usage: "file holding a Standard Webhooks secret (repeatable)"},
			&cli.StringFlag{Name: "twilio-token-env", Usage: "environment variable holding the Twilio auth token"},
			&cli.StringFlag{Name: "twilio-token-file", Usage: "file holding the Twilio auth token"},
			&cli.StringFlag{Name: "postmark-user", Usage: "user name Postmark's webhooks authenticate with (basic authentication in the webhook URL)"},
			&cli.StringFlag{Name: "postmark-password-env", Usage: "environment variable holding that password"},
			&cli.StringFlag{Name: "postmark-password-file", Usage: "file holding that password"},
			&cli.StringFlag{Name: "postmark-header", Usage: "name of a custom header Postmark's webhooks carry, e.g. X-Receipt-Token"},
			&cli.StringFlag{Name: "postmark-header-value-env", Usage: "environment variable holding that header's secret value"},
			&cli.StringFlag{Name: "postmark-header-value-file", Usage: "file holding that header's secret value"},
			&cli.StringSliceFlag{Name: "ses-topic-arn", Usage: "an SNS topic SES publishes events to, e.g. arn:aws:sns:eu-west-1:123456789012:ses-events (repeatable): serves /receipts/ses"},
			&cli.DurationFlag{Name: "sns-fetch-timeout", Value: receipts.DefaultFetchTimeout, Usage: "bound on fetching an SNS signing certificate or confirming a subscription"},
			&cli.StringFlag{Name: "sns-ca-file", Usage: "extra PEM roots for SNS's HTTPS (a fake SNS in tests); verification stays on"},
			&cli.StringFlag{Name: "sns-connect-to", Usage: "loopback host:port to dial for sns.<region>.amazonaws.com (a fake SNS in tests; TLS still verifies the SNS name)"},
			&cli.StringFlag{Name: "public-url", Usage: "the scheme and host providers call, e.g. https://receipts.example.com (required with Twilio)"},
			&cli.BoolFlag{Name: "disable-on-bounce", Usage: "a hard bounce switches the user's preference on that channel off"},
			&cli.DurationFlag{Name: "sweep", Value: 5 * time.Second, Usage: "how often to settle tasks whose receipt came while they were held"},
			&cli.DurationFlag{Name: "tolerance", Value: receipts.DefaultTolerance, Usage: "how far a Standard Webhooks timestamp may be from now"},
		},
		Action: func(c *cli.Context) error { return serveReceipts(c, e) },
	}
}

// receiptsConfig is the validated receipts command line.
type receiptsConfig struct {
	listen string
	sweep  time.Duration
	h      receipts.Config
}

func parseReceipts(c *cli.Context, e *env) (receiptsConfig, error) {
	cfg := receiptsConfig{listen: c.String("listen"), sweep: c.Duration("sweep")}
	if cfg.listen == "" {
		return cfg, usagef("receipts: missing required flag --listen")
	}
	if _, _, err := net.SplitHostPort(cfg.listen); err != nil {
		return cfg, usagef("invalid --listen %q: want host:port, e.g. 127.0.0.1:8088", cfg.listen)
	}
	if cfg.sweep <= 0 || c.Duration("tolerance") <= 0 {
		return cfg, usagef("--sweep and --tolerance must be more than 0")
	}
	cfg.h = receipts.Config{DisableOnBounce: c.Bool("disable-on-bounce"), Tolerance: c.Duration("tolerance")}
	var secrets []string
	for _, name := range c.StringSlice("webhook-secret-env") {
		v := e.getenv(name)
		if v == "" {
			return cfg, usagef("invalid --webhook-secret-env %s: the variable is empty or not set", name)
		}
		secrets = append(secrets, v)
	}
	for _, f := range c.StringSlice("webhook-secret-file") {
		b, err := os.ReadFile(f)
		if err != nil {
			return cfg, usagef("invalid --webhook-secret-file: %v", err)
		}
		secrets = append(secrets, strings.TrimSpace(string(b)))
	}
	for _, s := range secrets {
		key, err := webhook.ParseSecret(s)
		if err != nil {
			return cfg, usagef("invalid Standard Webhooks secret: %v", err)
		}
		cfg.h.WebhookKeys = append(cfg.h.WebhookKeys, key)
	}
	switch env, file := c.String("twilio-token-env"), c.String("twilio-token-file"); {
	case env != "" && file != "":
		return cfg, usagef("--twilio-token-env and --twilio-token-file: give one")
	case env != "":
		if cfg.h.TwilioAuthToken = e.getenv(env); cfg.h.TwilioAuthToken == "" {
			return cfg, usagef("invalid --twilio-token-env %s: the variable is empty or not set", env)
		}
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return cfg, usagef("invalid --twilio-token-file: %v", err)
		}
		if cfg.h.TwilioAuthToken = strings.TrimSpace(string(b)); cfg.h.TwilioAuthToken == "" {
			return cfg, usagef("invalid --twilio-token-file %s: empty", file)
		}
	}
	if err := parsePostmarkAuth(c, e, &cfg.h.Postmark); err != nil {
		return cfg, err
	}
	if err := parseSES(c, &cfg.h.SES); err != nil {
		return cfg, err
	}
	if raw := c.String("public-url"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
			return cfg, usagef("invalid --public-url: want https://host[:port][/path], without credentials or query")
		}
		cfg.h.PublicURL = u
	}
	switch {
	case len(cfg.h.WebhookKeys) == 0 && cfg.h.TwilioAuthToken == "" && !cfg.h.Postmark.Enabled() && !cfg.h.SES.Enabled():
		return cfg, usagef("receipts: no secret given: --webhook-secret-env/-file for Standard Webhooks, --twilio-token-env/-file for Twilio, --postmark-password-env/-file or --postmark-header-value-env/-file for Postmark, --ses-topic-arn for SES through SNS")
	case cfg.h.TwilioAuthToken != "" && cfg.h.PublicURL == nil:
		return cfg, usagef("receipts: --public-url is required with Twilio (its signature covers the URL it called)")
	}
	return cfg, nil
}

// parsePostmarkAuth reads the credentials Postmark's webhooks must present: a user with a password,
// and/or a header with a value, each pair whole.
func parsePostmarkAuth(c *cli.Context, e *env, a *receipts.PostmarkAuth) error {
	var err error
	if a.Password, err = secretFlag(c, e, "postmark-password"); err != nil {
		return err
	}
	if a.HeaderValue, err = secretFlag(c, e, "postmark-header-value"); err != nil {
		return err
	}
	a.Username, a.Header = c.String("postmark-user"), c.String("postmark-header")
	switch {
	case (a.Username == "") != (a.Password == ""):
		return usagef("--postmark-user and --postmark-password-env/-file: give both, or neither")
	case (a.Header == "") != (a.HeaderValue == ""):
		return usagef("--postmark-header and --postmark-header-value-env/-file: give both, or neither")
	case a.Header != "" && strings.ContainsAny(a.Header, " :\r\n"):
		return usagef("invalid --postmark-header %q: want a header name such as X-Receipt-Token", a.Header)
	}
	return nil
}

// parseSES reads the SNS topics SES publishes to and how SNS's certificates are fetched.
func parseSES(c *cli.Context, s *receipts.SESConfig) error {
	for _, arn := range c.StringSlice("ses-topic-arn") {
		if !receipts.ValidTopicARN(arn) {
			return usagef("invalid --ses-topic-arn %q: want arn:aws:sns:REGION:ACCOUNT:TOPIC", arn)
		}
		s.TopicARNs = append(s.TopicARNs, arn)
	}
	opt := receipts.FetchOptions{CAFile: c.String("sns-ca-file"), ConnectTo: c.String("sns-connect-to")}
	switch s.FetchTimeout = c.Duration("sns-fetch-timeout"); {
	case s.FetchTimeout <= 0:
		return usagef("--sns-fetch-timeout must be more than 0")
	case !s.Enabled() && (opt.CAFile != "" || opt.ConnectTo != ""):
		return usagef("--sns-ca-file and --sns-connect-to apply to --ses-topic-arn only")
	case !s.Enabled():
		return nil
	}
	fetch, err := receipts.HTTPFetch(opt)
	if err != nil {
		return usagef("invalid SNS fetch options: %v", err)
	}
	s.Fetch = fetch
	return nil
}

// secretFlag reads the secret of --NAME-env or --NAME-file ("" when neither is given).
func secretFlag(c *cli.Context, e *env, name string) (string, error) {
	envName, file := c.String(name+"-env"), c.String(name+"-file")
	switch {
	case envName != "" && file != "":
		return "", usagef("--%s-env and --%s-file: give one", name, name)
	case envName != "":
		v := e.getenv(envName)
		if v == "" {
			return "", usagef("invalid --%s-env %s: the variable is empty or not set", name, envName)
		}
		return v, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usagef("invalid --%s-file: %v", name, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", usagef("invalid --%s-file %s: empty", name, file)
		}
		return v, nil
	}
	return "", nil
}

func serveReceipts(c *cli.Context, e *env) error {
	cfg, err := parseReceipts(c, e)
	if err != nil {
		return err
	}
	pool, err := e.pool(4)
	if err != nil {
		return err
	}
	defer pool.Close()
	n := service.NewNotifier(pool)
	ctx, cancel := e.dbContext(c.Context)
	_, err = n.RequireWritable(ctx, "receipts") // a standby would refuse every receipt
	if err == nil {
		err = n.RequireRole(ctx, "receipts", service.RoleReceiver)
	}
	cancel()
	if err != nil {
		if c.Context.Err() != nil {
			return nil
		}
		return err
	}

	registry := prometheus.NewRegistry()
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "notifier_receipts_total",
		Help: "Provider callbacks by source and result: settled, noted, unchanged, contradicts, duplicate, or why refused (bad_signature, stale, too_large, malformed, unknown_type, unknown_reference, ambiguous_reference, bad_cert_url, foreign_topic, cert_unavailable, confirm_failed), or error; SNS's subscription_confirmed and unsubscribed.",
	}, []string{"source", "result"})
	swept := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "notifier_receipts_swept_total",
		Help: "Tasks settled by a receipt that arrived while a worker held them.",
	})
	registry.MustRegister(results, swept, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.h.Logger = e.log
	cfg.h.RecordTimeout = e.dbTimeout
	cfg.h.OnResult = func(source, result string) { results.WithLabelValues(source, result).Inc() }

	mux := http.NewServeMux()
	mux.Handle("/receipts/", receipts.NewHandler(n, cfg.h))
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	l, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("receipts: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	e.log.Info("serving receipts", "addr", l.Addr().String(), "standard_webhooks", len(cfg.h.WebhookKeys) > 0,
		"twilio", cfg.h.TwilioAuthToken != "", "postmark", cfg.h.Postmark.Enabled(), "ses_topics", cfg.h.SES.TopicARNs, "disable_on_bounce", cfg.h.DisableOnBounce)

	tick := time.NewTicker(cfg.sweep)
	defer tick.Stop()
	health := true
	for {
		select {
		case err := <-served:
			return fmt.Errorf("receipts: %w", err)
		case <-c.Context.Done():
			e.log.Info("stopping: callbacks in progress finish")
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer scancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("receipts: shut down: %w", err)
			}
			e.log.Info("receipts stopped")
			return nil
		case <-tick.C:
			ctx, cancel := e.dbContext(c.Context)
			settled, err := n.SweepReceipts(ctx, 100)
			cancel()
			switch {
			case err != nil && health:
				health = false
				e.log.Error("receipt sweep failing; retrying", "error", err)
			case err == nil && !health:
				health = true
				e.log.Info("receipt sweep recovered")
			}
			if settled > 0 {
				swept.Add(float64(settled))
				e.log.Info("RECEIPTS SWEPT", "settled", settled)
			}
		}
	}
}
