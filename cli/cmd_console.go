package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/cli/console"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/httpkit"
)

func consoleCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "console",
		Usage: "serve the operators' web console: review, resolve and status in a browser",
		UsageText: "notifier console [--listen 127.0.0.1:8080] {--users-file FILE | --trust-header NAME --trusted-proxy CIDR...}\n" +
			"   [--tls-cert FILE --tls-key FILE] [--insecure-listen] [--session-ttl 8h] [--metrics-addr ADDR]\n" +
			"   notifier console --hash-password < password",
		Description: helpText("console"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "address to serve on"},
			&cli.StringFlag{Name: "users-file", Usage: "htpasswd-style file of bcrypt users (name:$2y$...)"},
			&cli.StringFlag{Name: "trust-header", Usage: "header an authenticating proxy sets to the user, e.g. X-Forwarded-User"},
			&cli.StringSliceFlag{Name: "trusted-proxy", Usage: "CIDR or address of the proxy whose --trust-header is believed (repeatable)"},
			&cli.StringFlag{Name: "tls-cert", Usage: "TLS certificate file (PEM), with --tls-key"},
			&cli.StringFlag{Name: "tls-key", Usage: "TLS private key file (PEM), with --tls-cert"},
			&cli.BoolFlag{Name: "insecure-listen", Usage: "serve plain HTTP on a non-loopback address (and cookies without Secure)"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9470; unauthenticated: keep it off the network)"},
			&cli.DurationFlag{Name: "session-ttl", Value: 8 * time.Hour, Usage: "a session ends this long after sign-in"},
			&cli.BoolFlag{Name: "hash-password", Usage: "print the bcrypt hash of the password on stdin's first line, and exit"},
		},
		Action: func(c *cli.Context) error {
			if c.Bool("hash-password") {
				return hashPassword(e)
			}
			return serveConsole(c, e)
		},
	}
}

func hashPassword(e *env) error {
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && line == "" {
		return usagef("console --hash-password: no password on stdin")
	}
	password := strings.TrimRight(line, "\r\n")
	h, err := console.HashPassword(password)
	if err != nil {
		return usagef("console --hash-password: %v", err)
	}
	_, err = fmt.Fprintln(e.stdout, h)
	return err
}

// consoleConfig is the validated console command line.
type consoleConfig struct {
	listen string
	tls    *tls.Config
	web    console.Config
}

func parseConsole(c *cli.Context) (consoleConfig, error) {
	cfg := consoleConfig{listen: c.String("listen")}
	host, _, err := net.SplitHostPort(cfg.listen)
	if err != nil {
		return cfg, usagef("invalid --listen %q: want host:port, e.g. 127.0.0.1:8080", cfg.listen)
	}
	usersFile, header := c.String("users-file"), c.String("trust-header")
	switch {
	case usersFile == "" && header == "":
		return cfg, usagef("console: give --users-file FILE or --trust-header NAME: the console lets no one in unauthenticated")
	case usersFile != "" && header != "":
		return cfg, usagef("console: give --users-file or --trust-header, not both")
	case header == "" && c.IsSet("trusted-proxy"):
		return cfg, usagef("console: --trusted-proxy goes with --trust-header")
	}
	if usersFile != "" {
		f, err := os.Open(usersFile)
		if err != nil {
			return cfg, usagef("invalid --users-file: %v", err)
		}
		users, err := console.ParseUsers(f)
		f.Close()
		if err != nil {
			return cfg, usagef("invalid --users-file %s: %v", usersFile, err)
		}
		cfg.web.Users = users
	} else {
		if http.CanonicalHeaderKey(header) == "" || strings.ContainsAny(header, " :\t") {
			return cfg, usagef("invalid --trust-header %q: want a header name such as X-Forwarded-User", header)
		}
		if !c.IsSet("trusted-proxy") {
			return cfg, usagef("console: --trust-header needs --trusted-proxy CIDR: a header is believed only from the proxy that sets it")
		}
		proxies, err := console.ParseCIDRs(c.StringSlice("trusted-proxy"))
		if err != nil {
			return cfg, usagef("invalid --trusted-proxy %v", err)
		}
		cfg.web.TrustHeader, cfg.web.TrustedProxies = header, proxies
	}
	certFile, keyFile := c.String("tls-cert"), c.String("tls-key")
	if (certFile == "") != (keyFile == "") {
		return cfg, usagef("console: --tls-cert and --tls-key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return cfg, usagef("invalid --tls-cert/--tls-key: %v", err)
		}
		cfg.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	insecure := c.Bool("insecure-listen")
	if cfg.tls == nil && !insecure && !httpkit.IsLoopbackHost(host) {
		return cfg, usagef("console: refusing to serve plain HTTP on %s, which is not a loopback address: give --tls-cert and --tls-key, listen on 127.0.0.1 behind a TLS proxy, or --insecure-listen to accept that sessions and notes cross the network unencrypted", cfg.listen)
	}
	if c.Duration("session-ttl") <= 0 {
		return cfg, usagef("invalid --session-ttl %s: must be more than 0", c.Duration("session-ttl"))
	}
	cfg.web.SessionTTL = c.Duration("session-ttl")
	// Secure unless plain HTTP was asked for on purpose: over TLS, behind a TLS proxy, and on loopback
	// (browsers treat http://127.0.0.1 and http://localhost as secure) the browser keeps Secure cookies.
	cfg.web.SecureCookie = cfg.tls != nil || !insecure
	return cfg, nil
}

func serveConsole(c *cli.Context, e *env) error {
	cfg, err := parseConsole(c)
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
	err = n.RequireRole(ctx, "console", service.RoleOperator)
	cancel()
	if err != nil {
		return err
	}
	cfg.web.Notifier, cfg.web.Log, cfg.web.DBTimeout = n, e.log, e.dbTimeout
	web, err := console.New(cfg.web)
	if err != nil {
		return err
	}
	if addr := c.String("metrics-addr"); addr != "" {
		stop, err := serveRegistry(e, addr, web.Registry())
		if err != nil {
			return err
		}
		defer stop()
	}
	l, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{Handler: web.Handler(), TLSConfig: cfg.tls,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: e.dbTimeout + 15*time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 32 << 10}
	served := make(chan error, 1)
	scheme := "http"
	if cfg.tls != nil {
		scheme = "https"
		go func() { served <- srv.ServeTLS(l, "", "") }()
	} else {
		go func() { served <- srv.Serve(l) }()
	}
	signIn := "users-file"
	if cfg.web.TrustHeader != "" {
		signIn = "trust-header " + cfg.web.TrustHeader
	}
	e.log.Info("serving console", "addr", l.Addr().String(), "url", scheme+"://"+l.Addr().String()+"/",
		"sign_in", signIn, "secure_cookie", cfg.web.SecureCookie)
	select {
	case err := <-served:
		return fmt.Errorf("console: %w", err)
	case <-c.Context.Done():
		e.log.Info("stopping console")
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("console: shut down: %w", err)
		}
		return nil
	}
}
