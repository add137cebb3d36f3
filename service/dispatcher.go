package service

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/notifierhq/notifier/service/delivery"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DispatcherConfig configures a worker's claim-call-finish cycle.
type DispatcherConfig struct {
	Worker      string                    // recorded as lease_owner and on every attempt
	Routes      map[string]delivery.Route // only tasks of these channels are claimed
	Lease       time.Duration             // how long a claim holds a task before others may take it over
	CallTimeout time.Duration             // client timeout of one channel call, body included
	DBTimeout   time.Duration             // bound on one claim or finish transaction
	Backoff     delivery.Backoff
	// Observer is told what the dispatcher alone sees: a claim held back by a rate limit, a pause, a
	// retried finish, a recovered claim (nil: NopObserver). Its methods run on the goroutine of the
	// claim or finish.
	Observer Observer
	// AccountPauseStart and AccountPauseMax bound the wait between probes of a paused channel: the first
	// probe after AccountPauseStart, doubled per refused probe up to AccountPauseMax.
	AccountPauseStart time.Duration
	AccountPauseMax   time.Duration
	// DisableUnregistered switches a user's preference on a channel off when its provider rejected a
	// message because the address is gone for good (Observation.Unregistered), so later notifications
	// are suppressed instead of sent to a dead address (Result.PrefDisabled).
	DisableUnregistered bool
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
	turn     atomic.Uint32 // which channel the next claim starts with
	// The channels whose rate-limit bucket the claims consult, set once by NewDispatcher before the
	// dispatcher is shared: few, so a list.
	limited []string
	buckets []Bucket // those buckets as NewDispatcher found them
}

// NewDispatcher checks the configuration, fills defaults, and writes the rate limits of its routes
// into their buckets (configureRateLimits), so that its claims consult every bucket of its channels
// from the first one: a dispatcher cannot be built that ignores a rate limit. It needs the database
// (bounded by DBTimeout).
func NewDispatcher(ctx context.Context, pool *pgxpool.Pool, cfg DispatcherConfig) (*Dispatcher, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	d := &Dispatcher{pool: pool, cfg: cfg}
	for name := range cfg.Routes {
		d.channels = append(d.channels, name)
	}
	slices.Sort(d.channels) // claims take the channels in turn, in this order: the same on every run
	setDefault(&d.cfg.Lease, DefaultLease)
	setDefault(&d.cfg.CallTimeout, DefaultCallTimeout)
	setDefault(&d.cfg.DBTimeout, DefaultDBTimeout)
	setDefault(&d.cfg.Backoff.Base, DefaultBackoff)
	setDefault(&d.cfg.Backoff.Max, DefaultMaxBackoff)
	setDefault(&d.cfg.AccountPauseStart, DefaultAccountPauseStart)
	setDefault(&d.cfg.AccountPauseMax, DefaultAccountPauseMax)
	if d.cfg.Observer == nil {
		d.cfg.Observer = NopObserver{}
	}
	var err error
	if d.buckets, err = d.configureRateLimits(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// Check refuses a configuration NewDispatcher would refuse, without the database: `work` checks its
// flags and channels file with it before it waits for a server.
func (cfg DispatcherConfig) Check() error {
	if err := checkText("worker id", cfg.Worker, MaxIDLength); err != nil {
		return err
	}
	if len(cfg.Routes) == 0 {
		return &delivery.InputError{Field: "channels", Reason: "a worker needs at least one channel"}
	}
	for name, r := range cfg.Routes {
		if err := checkChannel(name); err != nil {
			return err
		}
		if _, err := delivery.ParseMode(string(r.Mode)); err != nil {
			return err
		}
		if r.Client == nil {
			return &delivery.InputError{Field: "channel " + name, Reason: "no client"}
		}
		if r.RateLimit != (delivery.RateLimit{}) {
			if err := r.RateLimit.Check(); err != nil {
				return fmt.Errorf("rate limit of %s: %w", name, err)
			}
		}
	}
	return nil
}

// Buckets are the rate-limit buckets of this dispatcher's channels as it found them at construction:
// its own limits, and those other workers set.
func (d *Dispatcher) Buckets() []Bucket { return slices.Clone(d.buckets) }

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
	ResultSuppressed ResultKind = "SUPPRESSED" // the user disabled the channel, or the event was cancelled, before the call
	ResultStale      ResultKind = "STALE"      // this holder was superseded; its observation went to late_outcome
	// The server refused this attempt's own row of a finish (see FinishBatch): its observation is not
	// stored. The task stays SENDING with this token until its lease expires, then counts as uncertain.
	ResultUnrecorded ResultKind = "UNRECORDED"
	// The server refused to claim this task for what its own rows hold (see ClaimBatch): no call was
	// made, nothing of its history changed, and it is due again after the longest backoff.
	ResultSetAside ResultKind = "SET_ASIDE"
)

// Result is what one claim-call-finish cycle did.
type Result struct {
	Kind    ResultKind       `json:"result"`
	TaskID  int64            `json:"task_id,omitempty"`
	Channel string           `json:"channel,omitempty"`
	Attempt int              `json:"attempt,omitempty"`
	Action  delivery.Action  `json:"action,omitempty"`
	Outcome delivery.Outcome `json:"outcome,omitempty"`
	Token   string           `json:"token,omitempty"`
	Detail  string           `json:"detail,omitempty"`
	// Err is the database's refusal behind an UNRECORDED or SET_ASIDE result, as the driver returned it
	// (errors.As finds its *pgconn.PgError); Detail is its text.
	Err error `json:"-"`
	// PrefDisabled: the provider said the address is unregistered and DisableUnregistered switched the
	// user's preference on the channel off.
	PrefDisabled bool `json:"pref_disabled,omitempty"`
}

// Attempt is a claimed task this worker now holds: it must call the channel and then Finish.
type Attempt struct {
	TaskID         int64
	Channel        string
	Mode           delivery.Mode
	Contract       delivery.Contract
	No             int // attempt_no, 1-based
	MaxAttempts    int
	Token          string
	Action         delivery.Action
	PriorUncertain bool
	// AccountRefusals are the task's earlier attempts refused for an account state: refunded, they do
	// not count against MaxAttempts.
	AccountRefusals int
	// Probe: the one call a claim may make on a channel paused for an account state; its answer
	// ends the pause or doubles its backoff.
	Probe        bool
	UncertainAge time.Duration // with PriorUncertain: how long ago the uncertain attempt began, at claim
	LeaseUntil   time.Time
	claimed      time.Time // local monotonic clock at claim, to age UncertainAge at finish
	Message      delivery.Message
}

// Call performs the attempt's action on its channel, bounded by the client timeout. It is not
// cancelled with ctx: a worker that is shutting down lets an in-flight call end and records it.
func (d *Dispatcher) Call(ctx context.Context, a *Attempt) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.CallTimeout)
	defer cancel()
	client := d.cfg.Routes[a.Channel].Client
	if a.Action == delivery.ActionQuery {
		return client.Query(ctx, a.Message.Ref)
	}
	return client.Send(ctx, a.Message)
}

// errorText is last_error for an observation: empty (none) for an acceptance.
func errorText(obs delivery.Observation) string {
	switch obs.Outcome {
	case delivery.OutcomeAccepted, delivery.OutcomeAcceptedReplay, delivery.OutcomeQueryFound:
		return ""
	}
	text := string(obs.Outcome)
	if obs.Detail != "" {
		text += ": " + obs.Detail
	}
	return delivery.Truncate(text, MaxNoteLength)
}
