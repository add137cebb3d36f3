package cli

import (
	"context"
	"errors"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// work's preflight runs its checks in order and stops at the first that fails, whose error names the
// check and keeps what the check said and its type (the exit code and the pooler's fix depend on it).
func TestPreflightStopsAtTheFirstFailedCheck(t *testing.T) {
	is := is.New(t)
	var ran []string
	check := func(name string, err error) preflightCheck {
		return preflightCheck{name, func(context.Context) error { ran = append(ran, name); return err }}
	}
	refused := &service.PermissionError{Op: "work", Role: service.RoleWorker, Reason: "database user app is neither a member of notifier_worker nor the tables' owner"}
	err := runPreflight(context.Background(), []preflightCheck{
		check("writable server", nil), check("worker role", refused), check("pool share", errors.New("not reached")),
	})
	is.Equal(ran, []string{"writable server", "worker role"})        // in order, and none after the failure
	is.Equal(err.Error(), "preflight worker role: "+refused.Error()) // named, and its own words kept
	var perm *service.PermissionError
	is.True(errors.As(err, &perm)) // its type too
	is.Equal(ExitCode(err), exitRuntime)

	ran = nil
	is.NoErr(runPreflight(context.Background(), []preflightCheck{check("a", nil), check("b", nil)}))
	is.Equal(ran, []string{"a", "b"}) // all of them when none fails
}
