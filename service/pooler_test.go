package service

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"
)

// ExplainPooler names the fix of what only a pooler's configuration causes, and leaves the rest alone.
// The end-to-end cases run through PgBouncer in cli/pgbouncer_test.go.
func TestExplainPooler(t *testing.T) {
	pg := func(code, msg string) error {
		return fmt.Errorf("create: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, c := range []struct {
		name string
		err  error
		fix  string // "" when err is not the pooler's
	}{
		{"a statement gone", pg("26000", `prepared statement "stmtcache_1" does not exist`), "add default_query_exec_mode=exec to the database URL"},
		{"a statement name taken", pg("42P05", `prepared statement "stmtcache_1" already exists`), "add default_query_exec_mode=exec to the database URL"},
		{"plan_cache_mode refused", pg("08P01", "unsupported startup parameter: plan_cache_mode"),
			`add plan_cache_mode to its ignore_startup_parameters and set it on the login role instead: ALTER ROLE "w1" SET plan_cache_mode = force_generic_plan`},
		{"PGOPTIONS refused", pg("08P01", "unsupported startup parameter: options"), "add it to its ignore_startup_parameters, or remove it from the database URL and PGOPTIONS"},
		{"another protocol violation", pg("08P01", "invalid frontend message type 0"), ""},
		{"a row's fault", pg("23505", "duplicate key value violates unique constraint"), ""},
		{"no server answer", errors.New("connection reset by peer"), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			got := ExplainPooler(c.err, "w1")
			if c.fix == "" {
				is.Equal(got, c.err) // unchanged
				return
			}
			is.True(errors.Is(got, ErrPooler))                                                             // said to be the pooler's
			is.True(strings.Contains(got.Error(), c.fix))                                                  // with the fix
			is.True(strings.HasPrefix(got.Error(), c.err.Error()))                                         // after the error itself
			is.Equal(ExplainPooler(got, "w1"), got)                                                        // explained once
			is.True(errors.As(got, new(*pgconn.PgError)))                                                  // the server's error stays in the chain
			is.True(strings.Contains(got.Error(), "docs/operations.md#pgbouncer-and-prepared-statements")) // and where to read more
		})
	}
}
