// Package primary finds, among the hosts of a multi-host PostgreSQL URL, the one that takes writes, and
// gives that host's single-host URL: dbmate reads one host only, and migrations must go to the primary.
package primary

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/service/redact"
)

// Hosts splits a postgres:// URL whose authority names several hosts (host1:port1,host2:port2) into one
// URL per host, everything else unchanged. A single-host URL, or a key=value string, is returned alone.
func Hosts(raw string) ([]string, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return []string{raw}, nil // key=value: pgx reads host=a,b itself; dbmate cannot, and says so
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	userinfo, hosts := "", authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo, hosts = authority[:at+1], authority[at+1:]
	}
	if hosts == "" {
		return nil, fmt.Errorf("no host in %s", redact.URL(raw))
	}
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, fmt.Errorf("empty host in %s", redact.URL(raw))
		}
		out = append(out, scheme+"://"+userinfo+h+rest[end:])
	}
	return out, nil
}

// URL returns the single-host URL, among raw's hosts, of the first server that takes writes (not in
// recovery, not read-only), trying each for at most timeout.
func URL(ctx context.Context, raw string, timeout time.Duration) (string, error) {
	hosts, err := Hosts(raw)
	if err != nil {
		return "", err
	}
	var errs []error
	for _, h := range hosts {
		writable, err := takesWrites(ctx, h, timeout)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %s", redact.URL(h), redact.Scrub(err.Error(), h)))
		case writable:
			return h, nil
		default:
			errs = append(errs, fmt.Errorf("%s: read-only (a standby)", redact.URL(h)))
		}
	}
	return "", fmt.Errorf("no host takes writes: %w", errors.Join(errs...))
}

func takesWrites(ctx context.Context, url string, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return false, err
	}
	cfg.ValidateConnect = nil // ask, rather than refuse: target_session_attrs of the URL is not ours to apply
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	var writable bool
	err = conn.QueryRow(ctx, `SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'`).Scan(&writable)
	return writable, err
}
