package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ServerStanding is what the connected server says about itself: whether it takes writes, and whether a
// commit waits for a standby (docs/operations.md#high-availability).
type ServerStanding struct {
	InRecovery              bool   `json:"in_recovery"` // a standby (pg_is_in_recovery)
	ReadOnly                bool   `json:"read_only"`   // this session's transaction_read_only
	SynchronousCommit       string `json:"synchronous_commit"`
	SynchronousStandbyNames string `json:"synchronous_standby_names"`
	Standbys                int    `json:"standbys"` // walsenders streaming to standbys (pg_stat_replication)
	// SyncStandbys is how many of them are synchronous now; nil when this role cannot see replication
	// states (it needs pg_read_all_stats).
	SyncStandbys *int `json:"sync_standbys,omitempty"`
}

// Durability says what a commit survives, from the server's settings.
type Durability string

const (
	// DurabilitySynchronous: a commit waits until a standby has it, so a failover to a synchronous
	// standby loses no acknowledged commit (R1 and R3 hold across it).
	DurabilitySynchronous Durability = "SYNCHRONOUS"
	// DurabilityAsynchronous: standbys replicate, but a commit does not wait for them: a failover may
	// lose creates answered created=true and attempt rows of calls already made.
	DurabilityAsynchronous Durability = "ASYNCHRONOUS"
	// DurabilityNoStandby: no standby replicates from this server and commits do not wait for one: they
	// are as durable as this server's disk (a managed service may replicate below PostgreSQL, unseen).
	DurabilityNoStandby Durability = "NO_STANDBY"
)

// Writable reports whether the server takes writes.
func (s ServerStanding) Writable() bool { return !s.InRecovery && !s.ReadOnly }

// CommitsWaitForStandby reports whether a commit in this session waits for a standby.
func (s ServerStanding) CommitsWaitForStandby() bool {
	switch s.SynchronousCommit {
	case "on", "remote_write", "remote_apply":
		return strings.TrimSpace(s.SynchronousStandbyNames) != ""
	}
	return false
}

// Durability classifies the settings.
func (s ServerStanding) Durability() Durability {
	switch {
	case s.CommitsWaitForStandby():
		return DurabilitySynchronous
	case s.Standbys > 0:
		return DurabilityAsynchronous
	}
	return DurabilityNoStandby
}

// Warnings are what an operator should know about the settings: losses a failover or a crash can cause.
func (s ServerStanding) Warnings() []string {
	var w []string
	switch {
	case s.Durability() == DurabilityAsynchronous:
		w = append(w, fmt.Sprintf("commits do not wait for a standby (synchronous_commit=%s, synchronous_standby_names=%q) while %d standby(s) replicate: a failover may lose creates answered created=true and attempt rows of calls already made (docs/operations.md#high-availability)",
			s.SynchronousCommit, s.SynchronousStandbyNames, s.Standbys))
	case s.CommitsWaitForStandby() && s.SyncStandbys != nil && *s.SyncStandbys == 0:
		w = append(w, fmt.Sprintf("synchronous_standby_names=%q but no standby is synchronous now: commits wait until one is", s.SynchronousStandbyNames))
	}
	if s.SynchronousCommit == "off" {
		w = append(w, "synchronous_commit=off: a crash of the server may lose its last commits, creates answered created=true among them")
	}
	return w
}

// Standing reads the server's standing (ServerStanding).
func (n *Notifier) Standing(ctx context.Context) (ServerStanding, error) {
	r, err := n.q.ServerStanding(ctx)
	if err != nil {
		return ServerStanding{}, fmt.Errorf("read the server's standing: %w", err)
	}
	s := ServerStanding{InRecovery: r.InRecovery, ReadOnly: r.ReadOnly, SynchronousCommit: r.SynchronousCommit,
		SynchronousStandbyNames: r.SynchronousStandbyNames, Standbys: int(r.Standbys)}
	if r.SyncSeen == r.Standbys {
		s.SyncStandbys = ptr(int(r.SyncStandbys))
	}
	return s, nil
}

// RequireWritable refuses, with a *ReadOnlyError, a server that does not take writes: a standby, a
// primary demoted by a failover, or a session that is read-only by default. Commands that write check it
// before any work (a worker would otherwise claim nothing and retry forever).
func (n *Notifier) RequireWritable(ctx context.Context, op string) (ServerStanding, error) {
	s, err := n.Standing(ctx)
	if err != nil {
		return s, fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case s.InRecovery:
		return s, &ReadOnlyError{Op: op, Reason: "pg_is_in_recovery() is true: a standby, or a primary demoted by a failover"}
	case s.ReadOnly:
		return s, &ReadOnlyError{Op: op, Reason: "transaction_read_only is on: default_transaction_read_only, or a server kept read-only"}
	}
	return s, nil
}

// ErrReadOnly matches a *ReadOnlyError.
var ErrReadOnly = errors.New("database is read-only")

// ReadOnlyError says that the server refused to write, or would: it is not the primary.
type ReadOnlyError struct {
	Op     string
	Reason string // how the server said so
	Err    error  // the database's error (SQLSTATE 25006), when it refused a statement
}

func (e *ReadOnlyError) Error() string {
	return fmt.Sprintf("%s: the database server is read-only (%s); connect to the primary: name every host of the cluster in the database URL with target_session_attrs=read-write (postgres://user@db1:5432,db2:5432/notifier?target_session_attrs=read-write)",
		e.Op, e.Reason)
}

func (e *ReadOnlyError) Is(target error) bool { return target == ErrReadOnly }

func (e *ReadOnlyError) Unwrap() error { return e.Err }

// sqlStateReadOnly is read_only_sql_transaction: a write on a standby or in a read-only transaction.
const sqlStateReadOnly = "25006"

// refuseReadOnly turns the server's refusal to write (SQLSTATE 25006) into a *ReadOnlyError; any other
// error passes unchanged.
func refuseReadOnly(op string, err error) error {
	if sqlState(err) == sqlStateReadOnly {
		return &ReadOnlyError{Op: op, Reason: "SQLSTATE 25006: " + pgMessage(err), Err: err}
	}
	return err
}
