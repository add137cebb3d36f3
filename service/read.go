package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/dbgen"
)

// Task is a delivery task as operators and tests read it.
type Task struct {
	ID               int64          `json:"task_id"`
	NotificationID   int64          `json:"notification_id"`
	Channel          string         `json:"channel"`
	Ref              string         `json:"ref"`
	State            delivery.State `json:"state"`
	AttemptCount     int            `json:"attempt_count"`
	MaxAttempts      int            `json:"max_attempts"`
	LeaseOwner       string         `json:"lease_owner,omitempty"`
	LeaseUntil       *time.Time     `json:"lease_until,omitempty"`
	NextAttemptAt    *time.Time     `json:"next_attempt_at,omitempty"`
	OutcomeUncertain bool           `json:"outcome_uncertain"`
	UncertainSince   *time.Time     `json:"uncertain_since,omitempty"`
	NeedsReview      bool           `json:"needs_review"`
	ProviderMsgID    string         `json:"provider_msg_id,omitempty"`
	LastError        string         `json:"last_error,omitempty"`
	UpdatedAt        time.Time      `json:"updated_at"`
}

// AttemptRecord is one row of a task's history.
type AttemptRecord struct {
	No            int              `json:"attempt"`
	Action        delivery.Action  `json:"action"`
	Worker        string           `json:"worker"`
	StartedAt     time.Time        `json:"started_at"`
	FinishedAt    *time.Time       `json:"finished_at,omitempty"`
	Outcome       delivery.Outcome `json:"outcome,omitempty"`
	ProviderMsgID string           `json:"provider_msg_id,omitempty"`
	Error         string           `json:"error,omitempty"`
	LateOutcome   delivery.Outcome `json:"late_outcome,omitempty"`
	Note          string           `json:"note,omitempty"`
}

// Task reads one task; ErrNotFound when there is none.
func (n *Notifier) Task(ctx context.Context, id int64) (Task, error) {
	r, err := n.q.TaskGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, fmt.Errorf("task %d: %w", id, delivery.ErrNotFound)
	}
	if err != nil {
		return Task{}, fmt.Errorf("read task %d: %w", id, err)
	}
	return Task{
		ID: r.ID, NotificationID: r.NotificationID, Channel: r.Channel, Ref: r.Ref, State: delivery.State(r.State),
		AttemptCount: int(r.AttemptCount), MaxAttempts: int(r.MaxAttempts), LeaseOwner: deref(r.LeaseOwner),
		LeaseUntil: r.LeaseUntil, NextAttemptAt: r.NextAttemptAt, OutcomeUncertain: r.OutcomeUncertain, UncertainSince: r.UncertainSince,
		NeedsReview: r.NeedsReview, ProviderMsgID: deref(r.ProviderMsgID), LastError: deref(r.LastError), UpdatedAt: r.UpdatedAt,
	}, nil
}

// Attempts reads a task's history in order.
func (n *Notifier) Attempts(ctx context.Context, taskID int64) ([]AttemptRecord, error) {
	rows, err := n.q.AttemptListByTask(ctx, taskID)
	if err != nil {
		return nil, fmt.Errorf("read attempts of task %d: %w", taskID, err)
	}
	out := make([]AttemptRecord, len(rows))
	for i, r := range rows {
		out[i] = attemptRecord(r)
	}
	return out, nil
}

func attemptRecord(r dbgen.DeliveryAttempt) AttemptRecord {
	return AttemptRecord{
		No: int(r.AttemptNo), Action: delivery.Action(r.Action), Worker: r.Worker, StartedAt: r.StartedAt,
		FinishedAt: r.FinishedAt, Outcome: delivery.Outcome(deref(r.Outcome)), ProviderMsgID: deref(r.ProviderMsgID),
		Error: deref(r.Error), LateOutcome: delivery.Outcome(deref(r.LateOutcome)), Note: deref(r.Note),
	}
}

// ReviewKind says why a task is shown to a human.
type ReviewKind string

const (
	// ReviewParked: the task is parked (UNKNOWN, needs review); notifier resolve settles it.
	ReviewParked ReviewKind = "PARKED"
	// ReviewLateAccepted: the task is FAILED or SUPPRESSED, final, but a superseded holder's late answer
	// says the channel accepted it: the user may have received the message. Nothing can be resolved;
	// someone should know.
	ReviewLateAccepted ReviewKind = "LATE_ACCEPTED"
)

// ReviewTask is a task shown to a human (notifier review, the console): parked (to resolve) or
// late-accepted (to know about), as Review says, with its history.
type ReviewTask struct {
	Task
	Review   ReviewKind      `json:"review"`
	UserID   string          `json:"user_id"`
	EventKey string          `json:"event_key"`
	Attempts []AttemptRecord `json:"attempts"`
}

// Review lists what a human should look at, up to limit tasks with id > afterID in id order: parked
// tasks (to resolve) and final "not sent" tasks a late answer contradicts (to know about). Paging by
// the last id printed covers both. A user the database refuses gets a *PermissionError naming
// RoleOperator.
func (n *Notifier) Review(ctx context.Context, afterID int64, limit int) ([]ReviewTask, error) {
	tasks, err := n.review(ctx, afterID, limit)
	return tasks, needsRole("review", RoleOperator, err)
}

func (n *Notifier) review(ctx context.Context, afterID int64, limit int) ([]ReviewTask, error) {
	return n.reviewWhere(ctx, ReviewFilter{AfterID: afterID, Limit: limit})
}

// ReviewFilter narrows Review's list (the console's filters): only tasks of Channel, only tasks in State
// (UNKNOWN: the parked ones; FAILED or SUPPRESSED: the late-accepted ones in that state); "" is any.
type ReviewFilter struct {
	AfterID int64
	Limit   int
	Channel string
	State   delivery.State
}

// ReviewWhere is Review narrowed by f, paged the same way (by the last id shown). A state that no listed
// task can be in is an *InputError.
func (n *Notifier) ReviewWhere(ctx context.Context, f ReviewFilter) ([]ReviewTask, error) {
	switch f.State {
	case "", delivery.StateUnknown, delivery.StateFailed, delivery.StateSuppressed:
	default:
		return nil, &delivery.InputError{Field: "state", Reason: fmt.Sprintf("%q: listed tasks are UNKNOWN (parked), FAILED or SUPPRESSED", f.State)}
	}
	tasks, err := n.reviewWhere(ctx, f)
	return tasks, needsRole("review", RoleOperator, err)
}

func (n *Notifier) reviewWhere(ctx context.Context, f ReviewFilter) ([]ReviewTask, error) {
	var parked, late []ReviewTask
	var err error
	if f.State == "" || f.State == delivery.StateUnknown {
		if parked, err = n.parkedOf(ctx, f); err != nil {
			return nil, err
		}
	}
	if f.State != delivery.StateUnknown {
		if late, err = n.lateAcceptedOf(ctx, f); err != nil {
			return nil, err
		}
	}
	all := append(parked, late...)
	slices.SortFunc(all, func(a, b ReviewTask) int { return cmp.Compare(a.ID, b.ID) })
	return n.withAttempts(ctx, all[:min(f.Limit, len(all))]) // the history of the tasks shown only
}

func (n *Notifier) parkedOf(ctx context.Context, f ReviewFilter) ([]ReviewTask, error) {
	rows, err := n.q.TaskListParked(ctx, dbgen.TaskListParkedParams{AfterID: f.AfterID, Channel: optional(f.Channel), MaxRows: int32(f.Limit)})
	if err != nil {
		return nil, fmt.Errorf("list parked tasks: %w", err)
	}
	out := make([]ReviewTask, len(rows))
	for i, r := range rows {
		out[i] = reviewRow(r, ReviewParked)
	}
	return out, nil
}

func (n *Notifier) lateAcceptedOf(ctx context.Context, f ReviewFilter) ([]ReviewTask, error) {
	rows, err := n.q.TaskListLateAccepted(ctx, dbgen.TaskListLateAcceptedParams{AfterID: f.AfterID, Channel: optional(f.Channel),
		State: optional(string(f.State)), MaxRows: int32(f.Limit)})
	if err != nil {
		return nil, fmt.Errorf("list late-accepted tasks: %w", err)
	}
	out := make([]ReviewTask, len(rows))
	for i, r := range rows {
		out[i] = reviewRow(dbgen.TaskListParkedRow(r), ReviewLateAccepted)
	}
	return out, nil
}

// reviewTask is a listed task shown to a human for kind, without its history. A parked task is UNKNOWN,
// uncertain and needs review; a late-accepted one is final and neither.
func reviewRow(r dbgen.TaskListParkedRow, kind ReviewKind) ReviewTask {
	parked := kind == ReviewParked
	return ReviewTask{
		Task: Task{ID: r.ID, NotificationID: r.NotificationID, Channel: r.Channel, State: delivery.State(r.State),
			AttemptCount: int(r.AttemptCount), MaxAttempts: int(r.MaxAttempts), OutcomeUncertain: parked,
			NeedsReview: parked, ProviderMsgID: deref(r.ProviderMsgID), LastError: deref(r.LastError), UpdatedAt: r.UpdatedAt},
		Review: kind, UserID: r.UserID, EventKey: r.EventKey,
	}
}

// withAttempts adds each task's history, read for the whole page in one statement.
func (n *Notifier) withAttempts(ctx context.Context, tasks []ReviewTask) ([]ReviewTask, error) {
	if len(tasks) == 0 {
		return tasks, nil
	}
	ids := make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	byTask, err := attemptsOf(ctx, n.q, ids)
	if err != nil {
		return nil, err
	}
	for i := range tasks {
		tasks[i].Attempts = byTask[tasks[i].ID]
	}
	return tasks, nil
}

// attemptsOf reads the histories of the tasks taskIDs in one statement (AttemptListByTasks), each in
// order and in review's shape; every task asked for has an entry, empty (not nil) when it has no attempt.
func attemptsOf(ctx context.Context, q *dbgen.Queries, taskIDs []int64) (map[int64][]AttemptRecord, error) {
	rows, err := q.AttemptListByTasks(ctx, taskIDs)
	if err != nil {
		return nil, fmt.Errorf("read the attempts of %d tasks: %w", len(taskIDs), err)
	}
	byTask := make(map[int64][]AttemptRecord, len(taskIDs))
	for _, id := range taskIDs {
		byTask[id] = []AttemptRecord{}
	}
	for _, r := range rows {
		byTask[r.TaskID] = append(byTask[r.TaskID], attemptRecord(r))
	}
	return byTask, nil
}

// StateCount is the number of tasks of a channel in a state; Parked counts UNKNOWN tasks that need review.
type StateCount struct {
	Channel string         `json:"channel"`
	State   delivery.State `json:"state"`
	Parked  bool           `json:"parked"`
	Tasks   int64          `json:"tasks"`
}

// Status is a snapshot for operators.
type Status struct {
	Counts []StateCount `json:"counts"`
	Parked int64        `json:"parked"`
	// LateAccepted counts FAILED or SUPPRESSED tasks that a late answer or a receipt says were accepted
	// (see ReviewLateAccepted; notifier review lists them).
	LateAccepted int64 `json:"late_accepted"`
	// OldestReadySeconds is how long the longest-waiting due task has waited since it became due (its
	// next_attempt_at): a scheduled task counts only from its send time.
	OldestReadySeconds float64 `json:"oldest_ready_seconds"`
	// Scheduled counts the tasks waiting for their send time (create --send-at, --delay): never
	// attempted and not due yet. They are not overdue; a task set aside for a retry is not counted.
	Scheduled int64 `json:"scheduled"`
	// Receipts counts providers' receipts (notifier receipts) by kind and what they did to their task.
	Receipts []ReceiptCount `json:"receipts"`
	// RateLimits are the channels' rate-limit buckets (schema/001), as they stand now.
	RateLimits []Bucket `json:"rate_limits"`
	// ChannelPauses are the channels paused for an account state (schema/001), with their causes.
	ChannelPauses []ChannelPause `json:"channel_pauses"`
	// Database is the server's standing: whether commits wait for a standby.
	Database StandingReport `json:"database"`
}

// StandingReport is a ServerStanding with what follows from it.
type StandingReport struct {
	ServerStanding
	Durability Durability `json:"durability"`
	Warnings   []string   `json:"warnings,omitempty"`
}

// ReceiptCount is the number of receipts of one kind that had one effect.
type ReceiptCount struct {
	Kind     delivery.ReceiptKind   `json:"kind"`
	Effect   delivery.ReceiptEffect `json:"effect"`
	Receipts int64                  `json:"receipts"`
}

// Status counts tasks by channel and state and receipts by kind, measures how long the oldest due task
// has waited, and lists the rate limits. A user the database refuses gets a *PermissionError naming
// RoleOperator.
func (n *Notifier) Status(ctx context.Context) (Status, error) {
	s, err := n.status(ctx)
	return s, needsRole("status", RoleOperator, err)
}

func (n *Notifier) status(ctx context.Context) (Status, error) {
	rows, err := n.q.TaskCountByChannelState(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("count tasks: %w", err)
	}
	s := Status{Counts: make([]StateCount, len(rows))}
	for i, r := range rows {
		s.Counts[i] = StateCount{Channel: r.Channel, State: delivery.State(r.State), Parked: r.NeedsReview, Tasks: r.Tasks}
		if r.NeedsReview {
			s.Parked += r.Tasks
		}
	}
	if s.LateAccepted, err = n.q.TaskCountLateAccepted(ctx); err != nil {
		return Status{}, fmt.Errorf("count late-accepted tasks: %w", err)
	}
	if s.OldestReadySeconds, err = n.q.TaskOldestReady(ctx); err != nil {
		return Status{}, fmt.Errorf("oldest ready task: %w", err)
	}
	if s.Scheduled, err = n.q.TaskCountScheduled(ctx); err != nil {
		return Status{}, fmt.Errorf("count scheduled tasks: %w", err)
	}
	receipts, err := n.q.ReceiptCountByKind(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("count receipts: %w", err)
	}
	s.Receipts = make([]ReceiptCount, len(receipts))
	for i, r := range receipts {
		s.Receipts[i] = ReceiptCount{Kind: delivery.ReceiptKind(r.Kind), Effect: delivery.ReceiptEffect(r.Effect), Receipts: r.Receipts}
	}
	if s.RateLimits, err = n.RateLimits(ctx); err != nil {
		return Status{}, err
	}
	if s.ChannelPauses, err = n.ChannelPauses(ctx); err != nil {
		return Status{}, err
	}
	standing, err := n.Standing(ctx)
	if err != nil {
		return Status{}, err
	}
	s.Database = StandingReport{ServerStanding: standing, Durability: standing.Durability(), Warnings: standing.Warnings()}
	return s, nil
}

// Notification is one logical notification as operators read it.
type Notification struct {
	ID        int64     `json:"notification_id"`
	UserID    string    `json:"user_id"`
	EventKey  string    `json:"event_key"`
	Body      string    `json:"body"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Notification reads one notification; ErrNotFound when there is none.
func (n *Notifier) Notification(ctx context.Context, id int64) (Notification, error) {
	r, err := n.q.NotificationGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Notification{}, fmt.Errorf("notification %d: %w", id, delivery.ErrNotFound)
	}
	if err != nil {
		return Notification{}, needsRole("read a notification", RoleOperator, fmt.Errorf("read notification %d: %w", id, err))
	}
	return Notification{ID: r.ID, UserID: r.UserID, EventKey: r.EventKey, Body: r.Body, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt}, nil
}

// Bodies reads the bodies of notifications by id, for a page of listed tasks in one statement. An id with
// no notification has no entry.
func (n *Notifier) Bodies(ctx context.Context, ids []int64) (map[int64]string, error) {
	rows, err := n.q.NotificationListBodies(ctx, ids)
	if err != nil {
		return nil, needsRole("read bodies", RoleOperator, fmt.Errorf("read the bodies of %d notifications: %w", len(ids), err))
	}
	out := make(map[int64]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.Body
	}
	return out, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// AlertGauges is what the alert rules watch, fleet-wide (deploy/prometheus/notifier-rules.yml,
// docs/operations.md#alerts-and-dashboard): `notifier work --metrics-addr` reads it on an interval and
// exports it as gauges.
type AlertGauges struct {
	Parked              int64   // tasks waiting for a human now (as Status.Parked)
	OldestParkedSeconds float64 // since the longest-waiting of them was parked; 0 when none
	OldestDueSeconds    float64 // how long the longest-waiting due task has waited (as Status.OldestReadySeconds)
	LateAccepted        int64   // as Status.LateAccepted
	Scheduled           int64   // as Status.Scheduled
	RateLimits          []Bucket
	ChannelPauses       []ChannelPause // the channels paused for an account state (as Status.ChannelPauses)
}

// AlertGauges reads the gauges in four statements (TaskAlertGauges, RateLimitList, ChannelPauseList,
// TaskCountScheduled), each costing what there is to show rather than the size of the backlog. A worker's role may run it (it counts late
// acceptances through schema/004's function, reading no receipt); a user the database refuses gets a
// *PermissionError.
func (n *Notifier) AlertGauges(ctx context.Context) (AlertGauges, error) {
	row, err := n.q.TaskAlertGauges(ctx)
	if err != nil {
		return AlertGauges{}, needsRole("alert gauges", RoleWorker, fmt.Errorf("read the alert gauges: %w", err))
	}
	buckets, err := n.RateLimits(ctx)
	if err != nil {
		return AlertGauges{}, needsRole("alert gauges", RoleWorker, err)
	}
	pauses, err := n.ChannelPauses(ctx)
	if err != nil {
		return AlertGauges{}, needsRole("alert gauges", RoleWorker, err)
	}
	scheduled, err := n.q.TaskCountScheduled(ctx)
	if err != nil {
		return AlertGauges{}, needsRole("alert gauges", RoleWorker, fmt.Errorf("count scheduled tasks: %w", err))
	}
	return AlertGauges{Parked: row.Parked, OldestParkedSeconds: row.OldestParkedSeconds,
		OldestDueSeconds: row.OldestDueSeconds, LateAccepted: row.LateAccepted, Scheduled: scheduled, RateLimits: buckets,
		ChannelPauses: pauses}, nil
}
