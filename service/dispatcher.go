package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/dbgen"
)

// Route is one channel a dispatcher serves: its name (as in channel_pref.channel), its contract, and
// the client that calls it.
type Route struct {
	Mode   Mode
	Client Channel
}

// DispatcherConfig configures a worker's claim-call-finish cycle.
type DispatcherConfig struct {
	Worker      string           // recorded as lease_owner and on every attempt
	Routes      map[string]Route // only tasks of these channels are claimed
	Lease       time.Duration    // how long a claim holds a task before others may take it over
	CallTimeout time.Duration    // client timeout of one channel call, body included
	DBTimeout   time.Duration    // bound on one claim or finish transaction
	Backoff     Backoff
}

// Defaults for fields left zero.
const (
	DefaultLease       = 30 * time.Second
	DefaultCallTimeout = 10 * time.Second
	DefaultDBTimeout   = 10 * time.Second
	DefaultBackoff     = 2 * time.Second
	DefaultMaxBackoff  = 10 * time.Minute
)

// Dispatcher runs the delivery protocol for one worker: claim (first correctness check), call outside
// any transaction, finish (second correctness check).
type Dispatcher struct {
	pool     *pgxpool.Pool
	cfg      DispatcherConfig
	channels []string
}

// NewDispatcher checks the configuration and fills defaults.
func NewDispatcher(pool *pgxpool.Pool, cfg DispatcherConfig) (*Dispatcher, error) {
	if err := checkText("worker id", cfg.Worker, MaxIDLength); err != nil {
		return nil, err
	}
	if len(cfg.Routes) == 0 {
		return nil, &InputError{Field: "channels", Reason: "a worker needs at least one channel"}
	}
	d := &Dispatcher{pool: pool, cfg: cfg}
	for name, r := range cfg.Routes {
		if err := checkChannel(name); err != nil {
			return nil, err
		}
		if _, err := ParseMode(string(r.Mode)); err != nil {
			return nil, err
		}
		if r.Client == nil {
			return nil, &InputError{Field: "channel " + name, Reason: "no client"}
		}
		d.channels = append(d.channels, name)
	}
	setDefault(&d.cfg.Lease, DefaultLease)
	setDefault(&d.cfg.CallTimeout, DefaultCallTimeout)
	setDefault(&d.cfg.DBTimeout, DefaultDBTimeout)
	setDefault(&d.cfg.Backoff.Base, DefaultBackoff)
	setDefault(&d.cfg.Backoff.Max, DefaultMaxBackoff)
	return d, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// ResultKind names what one cycle did.
type ResultKind string

const (
	ResultNothing    ResultKind = "NOTHING"    // no task was due
	ResultSent       ResultKind = "SENT"       // accepted (or found) by the channel
	ResultPending    ResultKind = "PENDING"    // certainly not accepted; will be retried
	ResultUnknown    ResultKind = "UNKNOWN"    // may have been accepted; will be retried per channel mode
	ResultParked     ResultKind = "PARKED"     // may have been accepted; waits for a human
	ResultFailed     ResultKind = "FAILED"     // certainly not accepted; given up
	ResultSuppressed ResultKind = "SUPPRESSED" // the user disabled the channel before the call
	ResultStale      ResultKind = "STALE"      // this holder was superseded; its observation went to late_outcome
)

// Result is what one claim-call-finish cycle did.
type Result struct {
	Kind     ResultKind `json:"result"`
	TaskID   int64      `json:"task_id,omitempty"`
	Channel  string     `json:"channel,omitempty"`
	Attempt  int        `json:"attempt,omitempty"`
	Action   Action     `json:"action,omitempty"`
	Outcome  Outcome    `json:"outcome,omitempty"`
	Token    string     `json:"token,omitempty"`
	Detail   string     `json:"detail,omitempty"`
	Duration string     `json:"-"`
}

// Attempt is a claimed task this worker now holds: it must call the channel and then Finish.
type Attempt struct {
	TaskID         int64
	Channel        string
	Mode           Mode
	No             int // attempt_no, 1-based
	MaxAttempts    int
	Token          string
	Action         Action
	PriorUncertain bool
	LeaseUntil     time.Time
	Message        Message
}

// RunOnce claims one due task, calls its channel outside any transaction, and records the result.
func (d *Dispatcher) RunOnce(ctx context.Context) (Result, error) {
	a, settled, err := d.Claim(ctx)
	if err != nil || a == nil {
		return settled, err
	}
	obs := d.Call(ctx, a)
	return d.Finish(ctx, a, obs)
}

// Claim locks one due task (a SENDING task whose lease expired first, then the longest-waiting PENDING
// or UNKNOWN one), decides what to do with it, and commits. When it returns an Attempt, the caller holds
// the task's only valid token until the lease ends. Otherwise the Result says what was decided without
// a call (NOTHING, SUPPRESSED, FAILED, PARKED).
func (d *Dispatcher) Claim(ctx context.Context) (*Attempt, Result, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	var (
		attempt *Attempt
		result  = Result{Kind: ResultNothing}
	)
	err := inTx(ctx, d.pool, func(q *dbgen.Queries) error {
		attempt, result = nil, Result{Kind: ResultNothing}
		row, leaseExpired, err := d.lockNext(ctx, q)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		route := d.cfg.Routes[row.Channel]
		if leaseExpired && row.HeldToken != nil {
			if _, err := q.AttemptMarkLeaseExpired(ctx, *row.HeldToken); err != nil {
				return fmt.Errorf("close expired attempt: %w", err)
			}
		}
		dec := Decide(ClaimFacts{
			Uncertain: row.OutcomeUncertain, LeaseExpired: leaseExpired,
			PrefEnabled: row.PrefEnabled, Expired: row.Expired,
			AttemptCount: int(row.AttemptCount), MaxAttempts: int(row.MaxAttempts), Mode: route.Mode,
		})
		result = Result{TaskID: row.ID, Channel: row.Channel}
		switch dec.Kind {
		case ClaimPark:
			result.Kind, result.Detail = ResultParked, dec.Reason
			return q.TaskPark(ctx, dbgen.TaskParkParams{ID: row.ID, LastError: dec.Reason})
		case ClaimSettle:
			no, err := q.TaskSettleWithoutCall(ctx, dbgen.TaskSettleWithoutCallParams{
				ID: row.ID, State: string(dec.State), NeedsReview: dec.State == StateUnknown,
				OutcomeUncertain: dec.Uncertain, LastError: dec.Reason,
			})
			if err != nil {
				return fmt.Errorf("settle task %d: %w", row.ID, err)
			}
			result.Kind, result.Attempt, result.Action, result.Outcome = settledKind(dec.State), int(no), ActionSkip, dec.Outcome
			return q.AttemptRecordSkip(ctx, dbgen.AttemptRecordSkipParams{
				TaskID: row.ID, AttemptNo: no, Worker: d.cfg.Worker, Outcome: string(dec.Outcome), Error: dec.Reason,
			})
		}
		started, err := q.TaskStartAttempt(ctx, dbgen.TaskStartAttemptParams{
			ID: row.ID, Worker: d.cfg.Worker, LeaseSeconds: d.cfg.Lease.Seconds(), OutcomeUncertain: dec.Uncertain,
		})
		if err != nil {
			return fmt.Errorf("start attempt on task %d: %w", row.ID, err)
		}
		if err := q.AttemptStart(ctx, dbgen.AttemptStartParams{
			TaskID: row.ID, AttemptNo: started.AttemptCount, AttemptToken: started.AttemptToken,
			Action: string(dec.Action), Worker: d.cfg.Worker,
		}); err != nil {
			return fmt.Errorf("open attempt on task %d: %w", row.ID, err)
		}
		attempt = &Attempt{
			TaskID: row.ID, Channel: row.Channel, Mode: route.Mode, No: int(started.AttemptCount),
			MaxAttempts: int(row.MaxAttempts), Token: started.AttemptToken, Action: dec.Action,
			PriorUncertain: dec.Uncertain, LeaseUntil: started.LeaseUntil,
			Message: Message{Ref: Ref(row.ID), IdempotencyKey: IdempotencyKey(row.ID), To: row.Address, Body: row.Body},
		}
		return nil
	})
	if err != nil {
		return nil, Result{}, fmt.Errorf("claim: %w", err)
	}
	if attempt != nil {
		result = Result{Kind: ResultKind(StateSending), TaskID: attempt.TaskID, Channel: attempt.Channel,
			Attempt: attempt.No, Action: attempt.Action, Token: attempt.Token}
	}
	return attempt, result, nil
}

// lockNext prefers a task whose holder's lease expired over a due one: it has waited longest.
func (d *Dispatcher) lockNext(ctx context.Context, q *dbgen.Queries) (dbgen.TaskClaimReadyRow, bool, error) {
	expired, err := q.TaskClaimExpiredLease(ctx, d.channels)
	if err == nil {
		return dbgen.TaskClaimReadyRow(expired), true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return dbgen.TaskClaimReadyRow{}, false, fmt.Errorf("lock expired lease: %w", err)
	}
	ready, err := q.TaskClaimReady(ctx, d.channels)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("lock due task: %w", err)
	}
	return ready, false, err
}

func settledKind(s State) ResultKind {
	if s == StateUnknown {
		return ResultParked
	}
	return ResultKind(s)
}

// Call performs the attempt's action on its channel, bounded by the client timeout. It is not
// cancelled with ctx: a worker that is shutting down lets an in-flight call end and records it.
func (d *Dispatcher) Call(ctx context.Context, a *Attempt) Observation {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.CallTimeout)
	defer cancel()
	client := d.cfg.Routes[a.Channel].Client
	if a.Action == ActionQuery {
		return client.Query(ctx, a.Message.Ref)
	}
	return client.Send(ctx, a.Message)
}

// Finish records an observation: the task changes only if this attempt's token is still the valid
// one; otherwise the observation is kept as the attempt's late_outcome and the result is STALE.
func (d *Dispatcher) Finish(ctx context.Context, a *Attempt, obs Observation) (Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	t := Next(Facts{Outcome: obs.Outcome, PriorUncertain: a.PriorUncertain, BudgetLeft: a.No < a.MaxAttempts, Mode: a.Mode})
	result := Result{TaskID: a.TaskID, Channel: a.Channel, Attempt: a.No, Action: a.Action, Outcome: obs.Outcome,
		Token: a.Token, Detail: obs.Detail}
	err := inTx(ctx, d.pool, func(q *dbgen.Queries) error {
		var retry *float64
		if t.Retry {
			retry = ptr(d.cfg.Backoff.Delay(a.No, obs.RetryAfter).Seconds())
		}
		n, err := q.TaskFinish(ctx, dbgen.TaskFinishParams{
			ID: a.TaskID, AttemptToken: a.Token, State: string(t.State), OutcomeUncertain: t.Uncertain,
			NeedsReview: t.Park, ProviderMsgID: nonEmpty(obs.ProviderMsgID), LastError: errorText(obs),
			RetryAfterSeconds: retry,
		})
		if err != nil {
			return fmt.Errorf("finish task %d: %w", a.TaskID, err)
		}
		if n == 0 {
			result.Kind = ResultStale
			_, err := q.AttemptRecordLate(ctx, dbgen.AttemptRecordLateParams{
				AttemptToken: a.Token, Outcome: string(obs.Outcome), ProviderMsgID: nonEmpty(obs.ProviderMsgID), Error: nonEmpty(obs.Detail),
			})
			return err
		}
		result.Kind = resultKind(t)
		_, err = q.AttemptFinish(ctx, dbgen.AttemptFinishParams{
			AttemptToken: a.Token, Outcome: string(obs.Outcome), ProviderMsgID: nonEmpty(obs.ProviderMsgID), Error: nonEmpty(obs.Detail),
		})
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("finish: %w", err)
	}
	return result, nil
}

func resultKind(t Transition) ResultKind {
	if t.Park {
		return ResultParked
	}
	return ResultKind(t.State)
}

func errorText(obs Observation) *string {
	switch obs.Outcome {
	case OutcomeAccepted, OutcomeAcceptedReplay, OutcomeQueryFound:
		return nil
	}
	text := string(obs.Outcome)
	if obs.Detail != "" {
		text += ": " + obs.Detail
	}
	return ptr(truncate(text, MaxNoteLength))
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return ptr(truncate(s, 500))
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}
