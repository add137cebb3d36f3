package service

import (
	"context"
	"errors"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/redact"
)

// WorkerPlanCacheMode is the plan_cache_mode a worker's connections run with. The dispatcher's
// statements are prepared (pgx prepares every statement) and written to be planned once: a generic plan
// reads only waiting tasks and looks every row up by key (TestClaimGenericPlanLooksUpByKey). Left to
// itself (plan_cache_mode = auto), PostgreSQL planned TaskStartAttempts and TaskFinish again on every
// call, because their generic plans guess 10 elements per array parameter where a custom plan sees one:
// with the planning, the server spent twice the CPU per delivery (docs/benchmarks.md#what-limits-throughput-here).
const WorkerPlanCacheMode = "force_generic_plan"

// ConfigureWorkerConn sets WorkerPlanCacheMode on the connections of a worker's pool, unless the
// connection string chooses a plan_cache_mode itself (a parameter, or -c in options/PGOPTIONS).
func ConfigureWorkerConn(cfg *pgx.ConnConfig) {
	if _, ok := cfg.RuntimeParams["plan_cache_mode"]; ok || strings.Contains(cfg.RuntimeParams["options"], "plan_cache_mode") {
		return
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["plan_cache_mode"] = WorkerPlanCacheMode
}

// PlanCacheModeWarning reads the plan_cache_mode a worker's session runs with and, when the pool asks
// for WorkerPlanCacheMode (ConfigureWorkerConn) and the session runs with something else, says why and
// what to do; "" when the session runs as asked. Behind PgBouncer the startup parameter is dropped
// (ignore_startup_parameters), and only the login role's own setting applies: a setting on a group role
// such as notifier_worker does not reach its members.
func PlanCacheModeWarning(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	cfg := pool.Config().ConnConfig
	if cfg.RuntimeParams["plan_cache_mode"] != WorkerPlanCacheMode {
		return "", nil
	}
	mode, err := dbgen.New(pool).SessionPlanCacheMode(ctx)
	if err != nil {
		return "", fmt.Errorf("read the session's plan_cache_mode: %w", err)
	}
	if mode == WorkerPlanCacheMode {
		return "", nil
	}
	return fmt.Sprintf("the database session runs with plan_cache_mode = %s, not %s: a connection pooler dropped the startup parameter "+
		"(PgBouncer's ignore_startup_parameters), and the server may plan the claim and the finish on every call; "+
		"set it on the login role: ALTER ROLE %s SET plan_cache_mode = %s (a group role's setting does not apply to its members; %s)",
		mode, WorkerPlanCacheMode, pgx.Identifier{cfg.User}.Sanitize(), WorkerPlanCacheMode, poolerDocs), nil
}

// MaxPoolShare is the largest part of the server's connections one worker process may take: a quarter
// of what ordinary roles may open (max_connections less superuser_reserved_connections), so that other
// workers, the creators and the operators always find one.
const MaxPoolShare = 4

// CheckPoolShare refuses a pool that could open more than 1/MaxPoolShare of the server's connections.
// A worker's pool is sized by its claims and finishes, not by its calls in flight; a configuration the
// server cannot serve is a usage error said at start (an InputError), not a stall on "too many clients"
// later.
func CheckPoolShare(ctx context.Context, pool *pgxpool.Pool) error {
	available, err := dbgen.New(pool).ServerConnectionsAvailable(ctx)
	if err != nil {
		return fmt.Errorf("read the server's connection limit: %w", err)
	}
	if want := pool.Config().MaxConns; int(want)*MaxPoolShare > int(available) {
		return &delivery.InputError{Field: "database connections", Reason: fmt.Sprintf(
			"this worker's pool may open %d, more than a quarter of the %d the server accepts (max_connections less superuser_reserved_connections): lower --finishers (or pool_max_conns in the URL), or raise max_connections",
			want, available)}
	}
	return nil
}

// ParsePoolConfig is pgxpool.ParseConfig(raw) with an error that shows raw only through redact.URL:
// "invalid database URL: <pgx's reason, scrubbed>: <raw, redacted>". notifier's commands and both
// sides of the load bench read their database URL with it.
func ParsePoolConfig(raw string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		// The string goes last: redaction hides everything after a password=... it cannot delimit.
		return nil, fmt.Errorf("invalid database URL: %s: %s", parseConfigReason(err, raw), redact.URL(raw))
	}
	return cfg, nil
}

// parseConfigReason is why pgx refused a connection string, without the string: pgx quotes it with its own
// best-effort redaction, which printed the password of malformed strings (an unterminated quote, an
// escaped space in a key=value password). The reason and the wrapped error are kept, scrubbed again.
func parseConfigReason(err error, conn string) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return redact.Scrub(err.Error(), conn)
	}
	text, inner := pe.Error(), pe.Unwrap()
	if inner != nil {
		text = strings.TrimSuffix(text, " ("+inner.Error()+")")
	}
	// "cannot parse `<string>`: <reason>": the reason follows the last "`: ".
	why := "cannot parse it"
	if i := strings.LastIndex(text, "`: "); i >= 0 {
		why = text[i+len("`: "):]
	}
	if inner != nil {
		why += ": " + redact.Error(inner)
	}
	return redact.Scrub(why, conn)
}

// WaitForDatabase connects pool's first connection, retrying while no server accepts it (a failover in
// progress: with target_session_attrs=read-write no host is the primary yet; a server starting up or
// unreachable), with backoff from 250 ms doubling to 5 s, for at most wait; retrying is called before
// each wait. A server that answers but refuses us (authentication, an unknown database or role) is not
// retried: that needs a person. Returns the last error when wait runs out.
func WaitForDatabase(ctx context.Context, pool *pgxpool.Pool, wait time.Duration, retrying func(err error, next time.Duration)) error {
	deadline := time.Now().Add(wait)
	delay := 250 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, max(time.Second, min(DefaultDBTimeout, time.Until(deadline))))
		err := pool.Ping(pctx)
		cancel()
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			return err
		}
		next := delivery.Spread(delay)
		if wait <= 0 {
			return err
		}
		if time.Until(deadline) < next {
			return fmt.Errorf("no database server accepted a connection for %s: %w", wait.Round(time.Second), err)
		}
		if retrying != nil {
			retrying(err, next)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(next):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// unreachable reports whether a connection failed for want of a server that takes it: refused, timed
// out, a host that does not resolve, a server starting up or shutting down (57P03, 57P01), or no host
// of the URL acceptable (target_session_attrs). Not when a server answered and refused us: invalid
// authorization (28), an unknown database (3D), a missing privilege (42), or a startup parameter a
// pooler does not pass on (refusedStartupParameter).
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || refusedStartupParameter(err) != "" { // a pooler that answered and refused us
		return false
	}
	switch sqlClass(err) {
	case "28", "3D", "42":
		return false
	}
	return true
}
