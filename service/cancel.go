package service

import (
	"context"
	"fmt"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// CancelEffect is what a cancel did to one task (notifier_cancel, schema/005).
type CancelEffect string

const (
	// CancelSuppressed: the task was waiting and no attempt may have been accepted: now SUPPRESSED, with
	// a SKIP attempt CANCELLED. It is never called.
	CancelSuppressed CancelEffect = "CANCELLED"
	// CancelParked: the task was waiting with an uncertain history: now parked for review, with a SKIP
	// attempt CANCELLED_UNCERTAIN. It is never called again, and never written off: a human resolves it.
	CancelParked CancelEffect = "PARKED"
	// CancelAtNextClaim: the task is SENDING, its call cannot be recalled. Its holder's finish proceeds;
	// if the finish leaves it waiting (a certain refusal, an unknown outcome to retry), its next claim
	// settles it as cancelled, without a call.
	CancelAtNextClaim CancelEffect = "AT_NEXT_CLAIM"
	// CancelAlreadyParked: parked before the cancel; unchanged (a human resolves it).
	CancelAlreadyParked CancelEffect = "ALREADY_PARKED"
	// CancelFinal: SENT, FAILED or SUPPRESSED before the cancel; unchanged.
	CancelFinal CancelEffect = "FINAL"
)

// CancelledTask is one task as a cancel found and left it.
type CancelledTask struct {
	TaskID      int64          `json:"task_id"`
	Channel     string         `json:"channel"`
	StateBefore delivery.State `json:"state_before"`
	StateAfter  delivery.State `json:"state_after"`
	Effect      CancelEffect   `json:"effect"`
	// Changed: the cancel changed this task now (CANCELLED, PARKED), or recorded the cancel its next
	// claim applies (AT_NEXT_CLAIM, the first cancel only).
	Changed bool `json:"changed"`
}

// Cancellation is what Cancel did.
type Cancellation struct {
	UserID         string `json:"user_id"`
	EventKey       string `json:"event_key"`
	NotificationID *int64 `json:"notification_id"` // nil: no such notification, or one without tasks
	// Changed: some task changed (see CancelledTask.Changed). False when there is no such notification
	// or every task was already final or parked, or a cancel before this one already did all it could.
	Changed bool            `json:"changed"`
	Tasks   []CancelledTask `json:"tasks"`
}

// Cancel takes the event (userID, eventKey) back (docs/protocol.md#cancel), in one statement: a
// waiting task that certainly was never accepted becomes SUPPRESSED (a SKIP attempt CANCELLED); a
// waiting task with an uncertain history is parked for review (CANCELLED_UNCERTAIN), never written off;
// a task being called now cannot be recalled: the cancel is recorded on the notification and its next
// claim settles it, if its finish leaves it waiting. note, when not empty, is kept on the notification
// and on each cancel attempt. The notification stays: a later Create of the same event answers
// created=false. A database user without the creator role gets a *PermissionError (ErrPermission).
func (n *Notifier) Cancel(ctx context.Context, userID, eventKey, note string) (Cancellation, error) {
	if err := firstError(checkText("user", userID, MaxIDLength), checkText("event key", eventKey, MaxIDLength)); err != nil {
		return Cancellation{}, err
	}
	var notePtr *string
	if note != "" {
		if err := checkText("note", note, MaxNoteLength); err != nil {
			return Cancellation{}, err
		}
		notePtr = &note
	}
	rows, err := n.q.NotificationCancel(ctx, dbgen.NotificationCancelParams{UserID: userID, EventKey: eventKey, Note: notePtr})
	if err != nil {
		return Cancellation{}, n.refused("cancel", RoleCreator, fmt.Errorf("cancel %s/%s: %w", userID, eventKey, err))
	}
	c := Cancellation{UserID: userID, EventKey: eventKey, Tasks: make([]CancelledTask, len(rows))}
	for i, r := range rows {
		c.NotificationID = &r.NotificationID
		c.Changed = c.Changed || r.Changed
		c.Tasks[i] = CancelledTask{TaskID: r.TaskID, Channel: r.Channel, StateBefore: delivery.State(r.StateBefore),
			StateAfter: delivery.State(r.StateAfter), Effect: CancelEffect(r.Effect), Changed: r.Changed}
	}
	return c, nil
}
