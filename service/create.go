package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/notifierhq/notifier/service/delivery"

	"github.com/notifierhq/notifier/dbgen"
)

// CreateRequest is one event to submit (Create, CreateBatch).
type CreateRequest struct {
	UserID      string
	EventKey    string
	Body        string
	TTL         time.Duration
	MaxAttempts int
	// Channels, when not empty, restricts the tasks to these of the user's enabled channels (create
	// --channels); empty means every enabled channel.
	Channels []string
	// SendAt, when not zero, is when the tasks become due (create --send-at); one already past is due at
	// once. Delay, when not zero, is the same relative to the database clock at insert, as TTL is (create
	// --delay). At most one of the two; either must come before the expiry (docs/protocol.md#send-at).
	SendAt time.Time
	Delay  time.Duration
	// Fallback, when not empty, is an ordered chain (create --fallback): one task per chain channel the
	// user has enabled, the first due, each next one released only when the one before ends certainly
	// not sent (FAILED or SUPPRESSED), none called once one is SENT (docs/protocol.md#fallback). Not
	// with Channels; no channel twice.
	Fallback []string
}

// Validate checks the request without touching the database.
func (r CreateRequest) Validate() error {
	return firstError(ValidateCreate(r.UserID, r.EventKey, r.Body, r.TTL, r.MaxAttempts), r.ValidateChannels(), r.validateSendTime())
}

// validateSendTime checks the send time against the expiry. The expiry is counted from the database's
// clock at insert, which this host can only estimate: a SendAt within the clocks' skew of it passes here
// and is refused by the database (CHECK notification_send_before_expiry, or notifier_create's 22023),
// with nothing written either way.
func (r CreateRequest) validateSendTime() error {
	switch {
	case !r.SendAt.IsZero() && r.Delay != 0:
		return &delivery.InputError{Field: "send_at", Reason: "give a send time or a delay, not both"}
	case r.Delay < 0:
		return &delivery.InputError{Field: "delay", Reason: fmt.Sprintf("%s: a delay is more than 0 (a send time already past: --send-at)", r.Delay)}
	case r.Delay >= r.TTL && r.Delay > 0:
		return &delivery.InputError{Field: "delay", Reason: fmt.Sprintf("%s is at or after the expiry (ttl %s): the notification would expire before it is due", r.Delay, r.TTL)}
	case !r.SendAt.IsZero() && !r.SendAt.Before(time.Now().Add(r.TTL)):
		return &delivery.InputError{Field: "send_at", Reason: fmt.Sprintf("%s is at or after the expiry (now + ttl %s): the notification would expire before it is due",
			r.SendAt.Format(time.RFC3339Nano), r.TTL)}
	}
	return nil
}

// sendAtParam is how a request's send time travels to SQL (queries NotificationInsert,
// NotificationCreateInTx): an RFC 3339 time, or "" for none.
func (r CreateRequest) sendAtParam() string {
	if r.SendAt.IsZero() {
		return ""
	}
	return r.SendAt.Format(time.RFC3339Nano)
}

// sendBeforeExpiry turns the database's refusal of a send time at or after the expiry (the batch
// insert's CHECK, notifier_create's invalid_parameter_value naming send_at) into the *InputError that
// Validate gives when it can tell: a time this host's clock could not judge is refused all the same.
func sendBeforeExpiry(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.ConstraintName == "notification_send_before_expiry" ||
		(pgErr.Code == "22023" && strings.Contains(pgErr.Message, "send_at"))) {
		return &delivery.InputError{Field: "send_at", Reason: "at or after the expiry on the database clock: the notification would expire before it is due"}
	}
	return err
}

// ValidateChannels checks the channels the request names: each a channel name (the rule of
// schema/001's notifier_channel).
func (r CreateRequest) ValidateChannels() error {
	for _, c := range r.Channels {
		if !channelName.MatchString(c) {
			return &delivery.InputError{Field: "channels", Reason: fmt.Sprintf("%q: want 1-32 of a-z, 0-9, _ or -, starting with a letter", c)}
		}
	}
	if len(r.Fallback) > 0 && len(r.Channels) > 0 {
		return &delivery.InputError{Field: "fallback", Reason: "not with channels: a fallback chain names its channels itself"}
	}
	if len(r.Fallback) > MaxFallbackChain {
		return &delivery.InputError{Field: "fallback", Reason: fmt.Sprintf("%d channels, more than %d", len(r.Fallback), MaxFallbackChain)}
	}
	for i, c := range r.Fallback {
		if !channelName.MatchString(c) {
			return &delivery.InputError{Field: "fallback", Reason: fmt.Sprintf("%q: want 1-32 of a-z, 0-9, _ or -, starting with a letter", c)}
		}
		if slices.Contains(r.Fallback[:i], c) {
			return &delivery.InputError{Field: "fallback", Reason: fmt.Sprintf("%q is named twice: a chain calls each channel at most once", c)}
		}
	}
	return nil
}

// MaxFallbackChain bounds a fallback chain (schema/005's fallback_position).
const MaxFallbackChain = 32

// namedChannels is every channel the request names, restricting or chaining.
func (r CreateRequest) namedChannels() []string {
	return append(slices.Clone(r.Channels), r.Fallback...)
}

// Created is what submitting one event did: create's output.
type Created struct {
	NotificationID int64     `json:"notification_id"`
	Created        bool      `json:"created"`
	Tasks          []TaskRef `json:"tasks"`
	// ChannelsWithoutPreference lists the channels the request named on which the notification has no
	// task: the user has no enabled preference there (for created=false: the first submission made no
	// task there). Absent when the request named no channels, or when each one got its task.
	ChannelsWithoutPreference []string `json:"channels_without_preference,omitempty"`
}

// channelsWithoutTask is the part of named that tasks do not cover, in the order named.
func channelsWithoutTask(named []string, tasks []TaskRef) []string {
	var missing []string
	for _, c := range named {
		if !slices.ContainsFunc(tasks, func(t TaskRef) bool { return t.Channel == c }) && !slices.Contains(missing, c) {
			missing = append(missing, c)
		}
	}
	return missing
}

// channelList is how a request's channels travel to SQL: joined by commas (a channel name has none),
// empty for every enabled channel (queries TaskInsertForEnabledPrefs, NotificationCreateInTx).
func channelList(channels []string) string {
	return strings.Join(channels, ",")
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
		return nil, n.refused("create", RoleCreator, sendBeforeExpiry(fmt.Errorf("create: %w", err)))
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
		ins.SendAts = append(ins.SendAts, r.sendAtParam())
		ins.SendDelaySeconds = append(ins.SendDelaySeconds, r.Delay.Seconds())
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
			tasks.ChannelLists = append(tasks.ChannelLists, channelList(r.Channels))
			tasks.FallbackLists = append(tasks.FallbackLists, channelList(r.Fallback))
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
		out[i].ChannelsWithoutPreference = channelsWithoutTask(r.namedChannels(), out[i].Tasks)
	}
	return out, nil
}

// CreateTx submits one event inside the caller's transaction tx, through the database's notifier_create
// (schema/005): the caller's business writes and the notification commit or roll back together, at
// any savepoint level. Same answer as Create: the first submission of (user, event key) that commits
// creates; every other gets the existing notification, its tasks and created=false. At READ COMMITTED
// a concurrent submission of the same event waits for tx to end. At REPEATABLE READ or SERIALIZABLE a
// winner that committed after tx's snapshot cannot be read back: the error (SQLSTATE 40001) names the
// isolation level, and retrying the whole transaction answers created=false. tx's role needs
// notifier_creator. An error leaves tx aborted (PostgreSQL's rule): roll it back, or call inside a
// savepoint (tx.Begin) to carry on.
func (n *Notifier) CreateTx(ctx context.Context, tx pgx.Tx, r CreateRequest) (Created, error) {
	out, err := n.CreateBatchTx(ctx, tx, []CreateRequest{r})
	if err != nil {
		return Created{}, err
	}
	return out[0], nil
}

// CreateBatchTx is CreateTx of several events, answered in the order of reqs (at most MaxCreateBatch,
// every one valid, else nothing is written). Keys are locked in the order CreateBatch locks them, so
// that two batches never deadlock on each other.
func (n *Notifier) CreateBatchTx(ctx context.Context, tx pgx.Tx, reqs []CreateRequest) ([]Created, error) {
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
	var p dbgen.NotificationCreateInTxParams
	for _, r := range reqs {
		p.UserIDs = append(p.UserIDs, r.UserID)
		p.EventKeys = append(p.EventKeys, r.EventKey)
		p.Bodies = append(p.Bodies, r.Body)
		p.TTLSeconds = append(p.TTLSeconds, r.TTL.Seconds())
		p.MaxAttempts = append(p.MaxAttempts, int32(r.MaxAttempts))
		p.ChannelLists = append(p.ChannelLists, channelList(r.Channels))
		p.SendAts = append(p.SendAts, r.sendAtParam())
		p.SendDelaySeconds = append(p.SendDelaySeconds, r.Delay.Seconds())
		p.FallbackLists = append(p.FallbackLists, channelList(r.Fallback))
	}
	q := dbgen.New(tx)
	rows, err := q.NotificationCreateInTx(ctx, p)
	if err != nil {
		return nil, n.refused("create", RoleCreator, sendBeforeExpiry(fmt.Errorf("create: %w", err)))
	}
	if len(rows) != len(reqs) {
		return nil, fmt.Errorf("create: %d answers to %d events", len(rows), len(reqs))
	}
	out := make([]Created, len(reqs))
	ids := make([]int64, 0, len(rows))
	for _, row := range rows {
		i := row.N - 1
		out[i] = Created{NotificationID: row.NotificationID, Created: row.Created}
		ids = append(ids, row.NotificationID)
	}
	tasks, err := q.NotificationTasks(ctx, ids)
	if err != nil {
		return nil, n.refused("create", RoleCreator, fmt.Errorf("create: read tasks: %w", err))
	}
	byNotification := map[int64][]TaskRef{}
	for _, t := range tasks {
		byNotification[t.NotificationID] = append(byNotification[t.NotificationID], TaskRef{TaskID: t.ID, Channel: t.Channel, Ref: t.Ref})
	}
	for i := range out {
		out[i].Tasks = byNotification[out[i].NotificationID]
		if out[i].Tasks == nil {
			out[i].Tasks = []TaskRef{}
		}
		out[i].ChannelsWithoutPreference = channelsWithoutTask(reqs[i].namedChannels(), out[i].Tasks)
	}
	return out, nil
}
