package service

import (
	"context"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"time"

	"github.com/notifierhq/notifier/dbgen"
)

// CreateRequest is one event to submit (Create, CreateBatch).
type CreateRequest struct {
	UserID      string
	EventKey    string
	Body        string
	TTL         time.Duration
	MaxAttempts int
}

// Validate checks the request without touching the database.
func (r CreateRequest) Validate() error {
	return ValidateCreate(r.UserID, r.EventKey, r.Body, r.TTL, r.MaxAttempts)
}

// Created is what submitting one event did: create's output.
type Created struct {
	NotificationID int64     `json:"notification_id"`
	Created        bool      `json:"created"`
	Tasks          []TaskRef `json:"tasks"`
}

// MaxCreateBatch bounds the events of one CreateBatch (one transaction).
const MaxCreateBatch = 10_000

// CreateBatch submits events in one Read Committed transaction, as Create does one: per (user, event
// key) the first submission ever creates the notification and its tasks and reports Created; any other,
// earlier in this batch, in another batch, concurrent or later, gets the existing notification and tasks,
// writes nothing and reports created=false. The results are in the order of reqs. Every request must be
// valid (Validate): an invalid one fails the whole batch, with nothing written. A deadlock with another
// writer (rows are locked in key order, so batches never deadlock on each other) is retried.
func (n *Notifier) CreateBatch(ctx context.Context, reqs []CreateRequest) ([]Created, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) > MaxCreateBatch {
		return nil, &delivery.InputError{Field: "batch", Reason: fmt.Sprintf("%d events, more than %d", len(reqs), MaxCreateBatch)}
	}
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("event %d: %w", i+1, err)
		}
	}
	return n.create(ctx, reqs)
}

// create is CreateBatch of valid requests.
func (n *Notifier) create(ctx context.Context, reqs []CreateRequest) ([]Created, error) {
	var out []Created
	var err error
	for try := 0; try < 3; try++ {
		err = inTx(ctx, n.pool, func(q *dbgen.Queries) error {
			out, err = createBatch(ctx, q, reqs)
			return err
		})
		if sqlClass(err) != "40" { // a deadlock or serialization failure rolled it all back: once more
			break
		}
	}
	if err != nil {
		return nil, n.refused("create", RoleCreator, fmt.Errorf("create: %w", err))
	}
	return out, nil
}

type userEvent struct{ user, event string }

func createBatch(ctx context.Context, q *dbgen.Queries, reqs []CreateRequest) ([]Created, error) {
	ins := dbgen.NotificationInsertParams{}
	for _, r := range reqs {
		ins.UserIDs = append(ins.UserIDs, r.UserID)
		ins.EventKeys = append(ins.EventKeys, r.EventKey)
		ins.Bodies = append(ins.Bodies, r.Body)
		ins.TTLSeconds = append(ins.TTLSeconds, r.TTL.Seconds())
	}
	inserted, err := q.NotificationInsert(ctx, ins)
	if err != nil {
		return nil, fmt.Errorf("insert notifications: %w", err)
	}
	// The first request of each new key created it; every other request of the batch is a duplicate.
	newID := make(map[userEvent]int64, len(inserted))
	for _, r := range inserted {
		newID[userEvent{r.UserID, r.EventKey}] = r.ID
	}
	out := make([]Created, len(reqs))
	first := make(map[userEvent]bool, len(reqs))
	tasks := dbgen.TaskInsertForEnabledPrefsParams{}
	var again dbgen.NotificationListWithTasksParams
	for i, r := range reqs {
		k := userEvent{r.UserID, r.EventKey}
		id, created := newID[k]
		if created && !first[k] {
			first[k] = true
			out[i] = Created{NotificationID: id, Created: true}
			tasks.NotificationIDs = append(tasks.NotificationIDs, id)
			tasks.UserIDs = append(tasks.UserIDs, r.UserID)
			tasks.MaxAttempts = append(tasks.MaxAttempts, int32(r.MaxAttempts))
			continue
		}
		if !created {
			again.UserIDs = append(again.UserIDs, r.UserID)
			again.EventKeys = append(again.EventKeys, r.EventKey)
		}
	}
	byNotification := map[int64][]TaskRef{}
	if len(tasks.NotificationIDs) > 0 {
		rows, err := q.TaskInsertForEnabledPrefs(ctx, tasks)
		if err != nil {
			return nil, fmt.Errorf("insert tasks: %w", err)
		}
		for _, t := range rows {
			byNotification[t.NotificationID] = append(byNotification[t.NotificationID], TaskRef{TaskID: t.ID, Channel: t.Channel, Ref: t.Ref})
		}
	}
	existing := map[userEvent]int64{}
	if len(again.UserIDs) > 0 {
		// Someone else's insert won, before or concurrently: a new statement sees their committed rows.
		rows, err := q.NotificationListWithTasks(ctx, again)
		if err != nil {
			return nil, fmt.Errorf("read existing notifications: %w", err)
		}
		for _, t := range rows {
			existing[userEvent{t.UserID, t.EventKey}] = t.NotificationID
			if t.TaskID != nil {
				byNotification[t.NotificationID] = append(byNotification[t.NotificationID],
					TaskRef{TaskID: *t.TaskID, Channel: deref(t.Channel), Ref: deref(t.Ref)})
			}
		}
	}
	for i, r := range reqs {
		k := userEvent{r.UserID, r.EventKey}
		if !out[i].Created {
			id, ok := newID[k]
			if !ok {
				if id, ok = existing[k]; !ok {
					return nil, fmt.Errorf("event %d (%s/%s): neither inserted nor found", i+1, r.UserID, r.EventKey)
				}
			}
			out[i].NotificationID = id
		}
		out[i].Tasks = byNotification[out[i].NotificationID]
		if out[i].Tasks == nil {
			out[i].Tasks = []TaskRef{}
		}
	}
	return out, nil
}
