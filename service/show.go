package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// ShowRequest names one notification: by its id, or by the (user, event key) it was created under.
// Exactly one of the two is given.
type ShowRequest struct {
	NotificationID int64
	UserID         string
	EventKey       string
}

// Validate checks that r names one notification one way.
func (r ShowRequest) Validate() error {
	byKey := r.UserID != "" || r.EventKey != ""
	switch {
	case r.NotificationID != 0 && byKey:
		return &delivery.InputError{Field: "notification", Reason: "give a notification id or a user and event key, not both"}
	case r.NotificationID < 0:
		return &delivery.InputError{Field: "notification", Reason: fmt.Sprintf("%d: a notification id is more than 0", r.NotificationID)}
	case r.NotificationID > 0:
		return nil
	case !byKey:
		return &delivery.InputError{Field: "notification", Reason: "give a notification id or a user and event key"}
	}
	return firstError(checkText("user", r.UserID, MaxIDLength), checkText("event key", r.EventKey, MaxIDLength))
}

// NotificationReport is one notification as it stands, with every task and every attempt: what a
// script that created an event reads to follow it (notifier show). The notification's own fields come
// first; a field the notification gains (a send time, a cancel) belongs beside ExpiresAt.
type NotificationReport struct {
	ID        int64     `json:"notification_id"`
	UserID    string    `json:"user_id"`
	EventKey  string    `json:"event_key"`
	CreatedAt time.Time `json:"created_at"`
	// SendAt is the send time the event was created with (create --send-at or --delay, schema/005): its
	// tasks waited until then. Null when it was sent at once.
	SendAt    *time.Time `json:"send_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	// CancelledAt is when notifier cancel took the event back (null if it did not); CancelNote its note.
	CancelledAt *time.Time   `json:"cancelled_at"`
	CancelNote  *string      `json:"cancel_note,omitempty"`
	Tasks       []TaskReport `json:"tasks"`
}

// TaskReport is one task of a NotificationReport with its history, the attempts in review's shape.
type TaskReport struct {
	ID           int64          `json:"task_id"`
	Channel      string         `json:"channel"`
	Ref          string         `json:"ref"`
	State        delivery.State `json:"state"`
	NeedsReview  bool           `json:"needs_review"`
	AttemptCount int            `json:"attempt_count"`
	LastError    *string        `json:"last_error"` // null when the task has none
	// FallbackPosition is the task's place in its fallback chain (1 = the first called), absent when
	// the notification has no chain. A later task is PENDING with no attempt until it is released.
	FallbackPosition *int16          `json:"fallback_position,omitempty"`
	Attempts         []AttemptRecord `json:"attempts"`
}

// Show reads one notification with its tasks and their attempts, all from one snapshot (a read-only
// REPEATABLE READ transaction, so a task's attempt_count and its attempts agree even while a worker
// delivers it). No such notification is ErrNotFound; a bad request an *InputError. It reads
// delivery_attempt, which the operator role may and the creator role may not: a user the database
// refuses gets a *PermissionError naming RoleOperator.
func (n *Notifier) Show(ctx context.Context, r ShowRequest) (NotificationReport, error) {
	if err := r.Validate(); err != nil {
		return NotificationReport{}, err
	}
	var out NotificationReport
	err := pgx.BeginTxFunc(ctx, n.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		out, err = show(ctx, dbgen.New(tx), r)
		return err
	})
	return out, needsRole("show", RoleOperator, err)
}

func show(ctx context.Context, q *dbgen.Queries, r ShowRequest) (NotificationReport, error) {
	var row dbgen.Notification
	var err error
	what := fmt.Sprintf("notification %d", r.NotificationID)
	if r.NotificationID > 0 {
		row, err = q.NotificationGet(ctx, r.NotificationID)
	} else {
		what = fmt.Sprintf("notification of user %q, event key %q", r.UserID, r.EventKey)
		row, err = q.NotificationGetByUserEvent(ctx, dbgen.NotificationGetByUserEventParams{UserID: r.UserID, EventKey: r.EventKey})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return NotificationReport{}, fmt.Errorf("%s: %w", what, delivery.ErrNotFound)
	}
	if err != nil {
		return NotificationReport{}, fmt.Errorf("read %s: %w", what, err)
	}
	rows, err := q.TaskListByNotification(ctx, row.ID)
	if err != nil {
		return NotificationReport{}, fmt.Errorf("read the tasks of notification %d: %w", row.ID, err)
	}
	ids := make([]int64, len(rows))
	for i, t := range rows {
		ids[i] = t.ID
	}
	// Read even when there is no task: the privilege to read attempts is what show needs, whatever
	// the notification holds.
	attempts, err := attemptsOf(ctx, q, ids)
	if err != nil {
		return NotificationReport{}, err
	}
	out := NotificationReport{ID: row.ID, UserID: row.UserID, EventKey: row.EventKey, CreatedAt: row.CreatedAt,
		SendAt: row.SendAt, ExpiresAt: row.ExpiresAt, CancelledAt: row.CancelledAt, CancelNote: row.CancelNote, Tasks: make([]TaskReport, len(rows))}
	for i, t := range rows {
		var position *int16
		if t.FallbackPosition.Valid {
			position = &t.FallbackPosition.Int16
		}
		out.Tasks[i] = TaskReport{ID: t.ID, Channel: t.Channel, Ref: t.Ref, State: delivery.State(t.State),
			NeedsReview: t.NeedsReview, AttemptCount: int(t.AttemptCount), LastError: t.LastError,
			FallbackPosition: position, Attempts: attempts[t.ID]}
	}
	return out, nil
}
