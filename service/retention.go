package service

import (
	"context"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"time"

	"github.com/notifierhq/notifier/dbgen"
)

// Retention limits.
const (
	// MinRetention is the shortest retention period Prune accepts. A finished task's attempts may still
	// receive a late observation (late_outcome) from a superseded holder until that holder's call and
	// finish are over, which the client timeout and the lease bound to minutes; an hour is far beyond
	// any sane setting. It is also the shortest dedupe window: once a notification is pruned, the same
	// (user, event key) submitted again creates a new one.
	MinRetention = time.Hour
	// MaxPruneBatch bounds the rows of each table one prune transaction deletes.
	MaxPruneBatch = 10000
	// MaxPrunePause bounds the pause between two prune batches.
	MaxPrunePause = time.Hour
)

// PruneStats counts what Prune deleted (or, from PrunePreview, would delete).
type PruneStats struct {
	Tasks         int64 `json:"tasks"`
	Attempts      int64 `json:"attempts"`
	Receipts      int64 `json:"receipts"`
	Notifications int64 `json:"notifications"`
	// Batches is the number of transactions that deleted something (PrunePreview: how many batches of
	// tasks a prune would take at the given batch size).
	Batches int64 `json:"batches"`
}

// ValidatePrune checks Prune's input without touching the database.
func ValidatePrune(olderThan time.Duration, batchSize int, pause time.Duration) error {
	switch {
	case olderThan < MinRetention:
		return &delivery.InputError{Field: "retention period", Reason: fmt.Sprintf("%s: must be at least %s (late observations of finished tasks, dedupe window)", olderThan, MinRetention)}
	case batchSize < 1 || batchSize > MaxPruneBatch:
		return &delivery.InputError{Field: "batch size", Reason: fmt.Sprintf("%d: must be between 1 and %d", batchSize, MaxPruneBatch)}
	case pause < 0 || pause > MaxPrunePause:
		return &delivery.InputError{Field: "pause", Reason: fmt.Sprintf("%s: must be between 0 and %s", pause, MaxPrunePause)}
	}
	return nil
}

// Prune deletes finished history older than olderThan: tasks in a terminal state (SENT, FAILED,
// SUPPRESSED) whose last change is older than that, all their attempts, and the notifications older
// than that which have no task left (including those that never had one: no channel was enabled). It
// never deletes a PENDING, SENDING or UNKNOWN task (parked or not), nor their attempts or notifications
// (queries/retention.sql; the database's delivery_attempt_retention_only trigger refuses it as well).
//
// It works in batches of at most batchSize tasks (and notifications), each its own short transaction,
// sleeping pause between them, until a batch finds nothing left; workers are never blocked for longer
// than one batch, and only on rows they do not need. Rows that become old while it runs are left to
// the next run. On an error or a cancelled ctx it stops: the batches done stay done (the stats say how
// many), the current one is rolled back. Running it twice at once is safe (SKIP LOCKED), though
// pointless.
func (n *Notifier) Prune(ctx context.Context, olderThan time.Duration, batchSize int, pause time.Duration) (PruneStats, error) {
	var st PruneStats
	if err := ValidatePrune(olderThan, batchSize, pause); err != nil {
		return st, err
	}
	secs := olderThan.Seconds()
	first := true
	wait := func() error {
		if first || pause == 0 {
			first = false
			return ctx.Err()
		}
		t := time.NewTimer(pause)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	// Finished tasks, their attempts, and the notifications they leave empty, oldest first.
	taskCursor := dbgen.RetentionPruneBatchParams{OlderThanSeconds: secs, BatchSize: int32(batchSize)}
	for {
		if err := wait(); err != nil {
			return st, pruneError(st, err)
		}
		r, err := n.q.RetentionPruneBatch(ctx, taskCursor)
		if err != nil {
			return st, pruneError(st, err)
		}
		if r.Picked == 0 {
			break
		}
		st.Tasks, st.Attempts, st.Notifications, st.Batches = st.Tasks+r.Tasks, st.Attempts+r.Attempts, st.Notifications+r.Notifications, st.Batches+1
		st.Receipts += r.Receipts
		taskCursor.AfterUpdatedAt, taskCursor.AfterID = r.LastUpdatedAt, r.LastID
	}
	// Notifications without any task: never had one, or lost their last ones to two concurrent batches.
	noteCursor := dbgen.RetentionPruneEmptyNotificationsParams{OlderThanSeconds: secs, BatchSize: int32(batchSize)}
	for {
		if err := wait(); err != nil {
			return st, pruneError(st, err)
		}
		r, err := n.q.RetentionPruneEmptyNotifications(ctx, noteCursor)
		if err != nil {
			return st, pruneError(st, err)
		}
		if r.Notifications > 0 {
			st.Notifications, st.Batches = st.Notifications+r.Notifications, st.Batches+1
		}
		if r.Walked == 0 || r.Old == 0 {
			break
		}
		noteCursor.AfterID = r.LastID
	}
	return st, nil
}

func pruneError(st PruneStats, err error) error {
	return fmt.Errorf("prune: stopped after %d batches (%d tasks, %d attempts, %d notifications deleted): %w",
		st.Batches, st.Tasks, st.Attempts, st.Notifications, err)
}

// PrunePreview reports what Prune with the same period would delete now, deleting nothing. It reads
// whole tables (one statement); Batches is how many batches of batchSize the tasks would take.
func (n *Notifier) PrunePreview(ctx context.Context, olderThan time.Duration, batchSize int) (PruneStats, error) {
	if err := ValidatePrune(olderThan, batchSize, 0); err != nil {
		return PruneStats{}, err
	}
	r, err := n.q.RetentionPreview(ctx, olderThan.Seconds())
	if err != nil {
		return PruneStats{}, fmt.Errorf("prune preview: %w", err)
	}
	return PruneStats{
		Tasks: r.Tasks, Attempts: r.Attempts, Receipts: r.Receipts, Notifications: r.Notifications,
		Batches: (r.Tasks + int64(batchSize) - 1) / int64(batchSize),
	}, nil
}
