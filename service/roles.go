package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// The database roles of schema/002_roles_and_row_security.sql: each command runs with one of them (or as the tables'
// owner).
const (
	RoleCreator  = "notifier_creator"  // create, pref set
	RoleWorker   = "notifier_worker"   // work
	RoleOperator = "notifier_operator" // resolve (EXECUTE on notifier_resolve), review, status
	RoleReceiver = "notifier_receiver" // receipts (schema/004)
)

// ErrPermission matches a *PermissionError.
var ErrPermission = errors.New("permission denied")

// PermissionError says that the database user may not run an operation, and which role it needs.
type PermissionError struct {
	Op     string // what was refused: "resolve", "create", "work", ...
	Role   string // the group role to grant
	Reason string // the database's words, or why the user does not qualify
	Err    error  // the database's error, when it refused the operation
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("%s needs the %s role: %s", e.Op, e.Role, e.Reason)
}

func (e *PermissionError) Is(target error) bool { return target == ErrPermission }

func (e *PermissionError) Unwrap() error { return e.Err }

// refused is err as a command reports it: a *PermissionError naming the role op needs (needsRole), a
// *ReadOnlyError when the server is not the primary (refuseReadOnly: the pool's connections to it are
// discarded, so that a long-running command reconnects, to the new primary after a failover), or err
// unchanged.
func (n *Notifier) refused(op, role string, err error) error {
	err = refuseReadOnly(op, needsRole(op, role, err))
	if errors.Is(err, ErrReadOnly) {
		n.pool.Reset()
	}
	return err
}

// needsRole turns the database's insufficient_privilege (no grant, or a row-level security policy that
// refused the row) into a *PermissionError naming the role op needs; any other error passes unchanged.
func needsRole(op, role string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return &PermissionError{Op: op, Role: role, Reason: pgErr.Message, Err: err}
	}
	return err
}

// RequireRole checks, once and before any work, that the connected user may run op, which needs role:
// a member of it, or the tables' owner (or a superuser or BYPASSRLS role). Without this a worker whose
// role may read but not claim tasks would see nothing under row-level security and answer NOTHING
// forever. role is RoleWorker, RoleCreator, RoleOperator or RoleReceiver.
func (n *Notifier) RequireRole(ctx context.Context, op, role string) error {
	c, err := n.q.RoleCapabilities(ctx)
	if err != nil {
		return fmt.Errorf("%s: read the database user's roles: %w", op, err)
	}
	may := map[string]bool{RoleWorker: c.CanWork, RoleCreator: c.CanCreate, RoleOperator: c.CanResolve, RoleReceiver: c.CanReceive}
	can, known := may[role]
	if !known {
		return fmt.Errorf("%s: unknown role %q", op, role)
	}
	if !can {
		return &PermissionError{Op: op, Role: role, Reason: fmt.Sprintf(
			"database user %s is neither a member of %s nor the tables' owner (GRANT %s TO %s)", c.UserName, role, role, c.UserName)}
	}
	return nil
}
