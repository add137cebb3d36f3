package service

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a connection pooler between notifier and PostgreSQL (PgBouncer) refuses or breaks, and what
// fixes it: errors only the pooler's configuration or the database URL can fix are said as such, with
// the fix, instead of as a database failure to retry (docs/operations.md#pgbouncer-and-prepared-statements).

// ErrPooler matches a *PoolerError.
var ErrPooler = errors.New("refused by a connection pooler")

// PoolerError is an error caused by a connection pooler's configuration, with its fix.
type PoolerError struct {
	Fix string // what to change, in the pooler or the database URL
	Err error  // the server's (or pooler's) error
}

func (e *PoolerError) Error() string { return e.Err.Error() + ": " + e.Fix }

func (e *PoolerError) Is(target error) bool { return target == ErrPooler }

func (e *PoolerError) Unwrap() error { return e.Err }

const poolerDocs = "docs/operations.md#pgbouncer-and-prepared-statements"

// SQLSTATEs of a prepared statement that is not where the connection left it.
const (
	sqlStateNoSuchStatement    = "26000" // invalid_sql_statement_name: a statement this connection prepared is gone
	sqlStateStatementExists    = "42P05" // duplicate_prepared_statement: a name this connection never used is taken
	sqlStateProtocolViolation  = "08P01"
	unsupportedStartupParamMsg = "unsupported startup parameter: " // PgBouncer's words for a parameter it does not pass on
)

// statementsLost reports whether the server says a statement notifier prepared by name on this
// connection is gone, or a name it was about to prepare is taken. notifier never runs PREPARE or
// DEALLOCATE: its named statements are pgx's statement cache and the claim's round trip (sendPipeline),
// made and dropped per connection. Either error therefore means that the server connection is not this
// client's alone: a pooler in transaction mode that hands it to other clients without keeping their
// statements apart (PgBouncer before 1.21, or with max_prepared_statements = 0), or that resets it
// between transactions (DISCARD ALL). Retrying cannot help: any statement may land on a server
// connection that lacks it.
func statementsLost(err error) bool {
	s := sqlState(err)
	return s == sqlStateNoSuchStatement || s == sqlStateStatementExists
}

// refusedStartupParameter is the startup parameter a pooler refused the connection for (PgBouncer:
// "unsupported startup parameter: plan_cache_mode", SQLSTATE 08P01), or "".
func refusedStartupParameter(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlStateProtocolViolation {
		return ""
	}
	param, ok := strings.CutPrefix(pgErr.Message, unsupportedStartupParamMsg)
	if !ok {
		return ""
	}
	return strings.TrimSpace(param)
}

// ExplainPooler returns err as a *PoolerError when a connection pooler's configuration caused it,
// naming the fix (user is the login role, for the ALTER ROLE the fix may need); any other error, or one
// already explained, is returned unchanged.
func ExplainPooler(err error, user string) error {
	if err == nil || errors.Is(err, ErrPooler) {
		return err
	}
	if statementsLost(err) {
		return &PoolerError{Err: err, Fix: "the database connection is shared with other clients without their prepared statements " +
			"(a pooler in transaction mode: PgBouncer before 1.21 or with max_prepared_statements = 0) or reset under it: " +
			"add default_query_exec_mode=exec to the database URL (" + poolerDocs + ")"}
	}
	param := refusedStartupParameter(err)
	switch {
	case param == "":
		return err
	case param == "plan_cache_mode":
		role := "<login role>"
		if user != "" {
			role = pgx.Identifier{user}.Sanitize()
		}
		return &PoolerError{Err: err, Fix: fmt.Sprintf("a connection pooler (PgBouncer) refuses the startup parameter plan_cache_mode that work sends: "+
			"add plan_cache_mode to its ignore_startup_parameters and set it on the login role instead: ALTER ROLE %s SET plan_cache_mode = %s (%s)",
			role, WorkerPlanCacheMode, poolerDocs)}
	default:
		return &PoolerError{Err: err, Fix: fmt.Sprintf("a connection pooler (PgBouncer) refuses the startup parameter %s: "+
			"add it to its ignore_startup_parameters, or remove it from the database URL and PGOPTIONS (%s)", param, poolerDocs)}
	}
}
