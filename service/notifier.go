package service

import (
	"context"
	"errors"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/dbgen"
)

// Input limits. The schema enforces the same bounds with CHECK constraints; checking here first gives
// callers a clear error before any row is touched.
const (
	MaxIDLength      = 200
	MaxAddressLength = 1000
	MaxBodyBytes     = 64 << 10
	MaxNoteLength    = 2000
	MaxAttemptsLimit = 100
	MaxTTL           = 365 * 24 * time.Hour
)

var channelName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Notifier is the business side: preferences, logical notifications, and the operator's resolution of
// parked tasks.
type Notifier struct {
	pool *pgxpool.Pool
	q    *dbgen.Queries
}

// NewNotifier uses pool for every call; it does not close it.
func NewNotifier(pool *pgxpool.Pool) *Notifier {
	return &Notifier{pool: pool, q: dbgen.New(pool)}
}

// Preference is a user's address and switch on one channel.
type Preference struct {
	UserID    string    `json:"user_id"`
	Channel   string    `json:"channel"`
	Address   string    `json:"address"`
	Enabled   bool      `json:"enabled"`
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SetPreference creates or replaces the user's address and switch on a channel. Disabling takes effect
// for every task not yet claimed.
func (n *Notifier) SetPreference(ctx context.Context, userID, channel, address string, enabled bool) (Preference, error) {
	if err := firstError(
		checkText("user", userID, MaxIDLength),
		checkChannel(channel),
		checkText("address", address, MaxAddressLength),
	); err != nil {
		return Preference{}, err
	}
	row, err := n.q.PrefUpsert(ctx, dbgen.PrefUpsertParams{UserID: userID, Channel: channel, Address: address, Enabled: enabled})
	if err != nil {
		return Preference{}, n.refused("set preference", RoleCreator, fmt.Errorf("set preference: %w", err))
	}
	return Preference(row), nil
}

// Create submits one event for a user: docs/protocol.md#create, in one Read Committed transaction. The first
// submission of (userID, eventKey) creates the notification and one PENDING task per enabled channel and
// reports created=true; every other submission, concurrent or later, gets the same id, the existing
// tasks and created=false, and writes nothing. The first body wins.
func (n *Notifier) Create(ctx context.Context, r CreateRequest) (int64, bool, []TaskRef, error) {
	if err := r.Validate(); err != nil {
		return 0, false, nil, err
	}
	out, err := n.create(ctx, []CreateRequest{r})
	if err != nil {
		return 0, false, nil, err
	}
	return out[0].NotificationID, out[0].Created, out[0].Tasks, nil
}

// ValidateCreate checks Create's input without touching the database.
func ValidateCreate(userID, eventKey, body string, ttl time.Duration, maxAttempts int) error {
	return firstError(
		checkText("user", userID, MaxIDLength),
		checkText("event key", eventKey, MaxIDLength),
		checkBody(body),
		checkTTL(ttl),
		checkMaxAttempts(maxAttempts),
	)
}

// ResolveManually is a human's final word on a parked task (state UNKNOWN with needs_review), after
// checking with the channel: SENT or FAILED, with a note saying why. It appends a MANUAL_SENT or
// MANUAL_FAILED attempt and reports true; on any other task, including one already resolved, it changes
// nothing and reports false. Concurrent calls on one task: exactly one reports true. A database user
// without the operator role gets a *PermissionError (ErrPermission).
func (n *Notifier) ResolveManually(ctx context.Context, taskID int64, final delivery.State, note, operator string) (bool, error) {
	switch final {
	case delivery.StateSent, delivery.StateFailed:
	default:
		return false, &delivery.InputError{Field: "state", Reason: fmt.Sprintf("%q: a parked task resolves to SENT or FAILED", final)}
	}
	if err := firstError(checkText("note", note, MaxNoteLength), checkText("operator", operator, MaxIDLength)); err != nil {
		return false, err
	}
	// One statement: notifier_resolve writes the task and its MANUAL attempt together, or neither.
	_, err := n.q.TaskResolveManually(ctx, dbgen.TaskResolveManuallyParams{
		ID: taskID, FinalState: string(final), Note: note, Operator: operator,
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, n.refused("resolve", RoleOperator, fmt.Errorf("resolve task %d: %w", taskID, err))
	}
	return true, nil
}

func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(q *dbgen.Queries) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		return fn(dbgen.New(tx))
	})
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func checkText(field, s string, max int) error {
	switch {
	case strings.TrimSpace(s) == "":
		return &delivery.InputError{Field: field, Reason: "must not be empty"}
	case utf8.RuneCountInString(s) > max:
		return &delivery.InputError{Field: field, Reason: fmt.Sprintf("longer than %d characters", max)}
	}
	return checkEncoding(field, s)
}

func checkEncoding(field, s string) error {
	if !utf8.ValidString(s) {
		return &delivery.InputError{Field: field, Reason: "not valid UTF-8"}
	}
	if strings.ContainsRune(s, 0) {
		return &delivery.InputError{Field: field, Reason: "contains a NUL byte"}
	}
	return nil
}

func checkChannel(c string) error {
	if !channelName.MatchString(c) {
		return &delivery.InputError{Field: "channel", Reason: fmt.Sprintf("%q: want 1-32 of a-z, 0-9, _ or -, starting with a letter", c)}
	}
	return nil
}

// checkBody refuses an empty or blank body: no channel can deliver "nothing", and an empty body is
// almost always an upstream mistake (`producer | notifier create --body -` after the producer failed)
// that would otherwise be delivered, and deduplicated forever under its event key.
func checkBody(body string) error {
	if strings.TrimSpace(body) == "" {
		return &delivery.InputError{Field: "body", Reason: "empty or only white space: a notification needs a message"}
	}
	if len(body) > MaxBodyBytes {
		return &delivery.InputError{Field: "body", Reason: fmt.Sprintf("%d bytes, more than the limit of %d", len(body), MaxBodyBytes)}
	}
	return checkEncoding("body", body)
}

func checkTTL(ttl time.Duration) error {
	// The database keeps microseconds; under a millisecond a notification would expire as it is created.
	if ttl < time.Millisecond || ttl > MaxTTL {
		return &delivery.InputError{Field: "ttl", Reason: fmt.Sprintf("%s: must be at least 1ms and at most %s", ttl, MaxTTL)}
	}
	return nil
}

func checkMaxAttempts(n int) error {
	if n < 1 || n > MaxAttemptsLimit {
		return &delivery.InputError{Field: "max attempts", Reason: fmt.Sprintf("%d: must be between 1 and %d", n, MaxAttemptsLimit)}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
