package service

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/dbgen"
)

// DispatcherConfig configures a worker's claim-call-finish cycle.
type DispatcherConfig struct {
	Worker      string                    // recorded as lease_owner and on every attempt
	Routes      map[string]delivery.Route // only tasks of these channels are claimed
	Lease       time.Duration             // how long a claim holds a task before others may take it over
	CallTimeout time.Duration             // client timeout of one channel call, body included
	DBTimeout   time.Duration             // bound on one claim or finish transaction
	Backoff     delivery.Backoff
	// RateLimited, when set, is told each time a claim of a channel was held back by the channel's rate
	// limit (no token, or fewer than the calls it could have made). Paused is told when a 429 paused a
	// channel for every worker (err: the pause could not be written). Both run on the goroutine of the
	// claim or finish: keep them short.
	RateLimited func(channel string)
	Paused      func(channel string, pause time.Duration, err error)
	// FinishRetried, when set, is told each time a finish of this many attempts is about to be sent again
	// after err (a broken connection, a failover: FinishBatch); try counts from 0. It runs on the
	// finish's goroutine.
	FinishRetried func(attempts, try int, err error)
	// ClaimRecovered, when set, is told when a claim whose commit's answer was lost (err) turned out to
	// have committed, and its attempts were recovered by their tokens.
	ClaimRecovered func(attempts int, err error)
	// FinishApart, when set, sends FinishBatchThenClaim's finish and claim as two round trips even on
	// connections that could carry the finish ahead of the claim (the prelude): the bench measures one
	// against the other (docs/benchmarks.md#the-finish-carried-ahead-of-the-claim).
	FinishApart bool
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
	pool      *pgxpool.Pool
	cfg       DispatcherConfig
	channels  []string
	turn      atomic.Uint32 // which channel the next claim starts with
	pipelines bool          // the pool's connections can carry a finish ahead of a claim (FinishBatchThenClaim)
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
	d := &Dispatcher{pool: pool, cfg: cfg, pipelines: !cfg.FinishApart && pipelines(pool.Config().ConnConfig)}
	for name := range cfg.Routes {
		d.channels = append(d.channels, name)
	}
	slices.Sort(d.channels) // claims take the channels in turn, in this order: the same on every run
	setDefault(&d.cfg.Lease, DefaultLease)
	setDefault(&d.cfg.CallTimeout, DefaultCallTimeout)
	setDefault(&d.cfg.DBTimeout, DefaultDBTimeout)
	setDefault(&d.cfg.Backoff.Base, DefaultBackoff)
	setDefault(&d.cfg.Backoff.Max, DefaultMaxBackoff)
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
	ResultSuppressed ResultKind = "SUPPRESSED" // the user disabled the channel before the call
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
	// CallDuration is how long the channel call took (set by the worker; zero without a call).
	CallDuration time.Duration `json:"-"`
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
	UncertainAge   time.Duration // with PriorUncertain: how long ago the uncertain attempt began, at claim
	LeaseUntil     time.Time
	claimed        time.Time // local monotonic clock at claim, to age UncertainAge at finish
	Message        delivery.Message
}

// ClaimBatch is the first correctness check. In one transaction it locks up to max due tasks (SENDING
// tasks whose lease expired first, then the longest-waiting PENDING or UNKNOWN ones) with SKIP LOCKED,
// closes the open attempts of expired leases as LEASE_EXPIRED, decides per task (Decide), and for the
// tasks to call sets a fresh token and lease and opens their attempt rows. After the commit the caller
// holds each returned Attempt's only valid token until its lease ends. Tasks settled without a call
// come back as Results. Two round trips when tasks are started: BEGIN with TaskClaim, then
// TaskStartAttempts with COMMIT (claimTx).
func (d *Dispatcher) ClaimBatch(ctx context.Context, limit int) ([]*Attempt, []Result, error) {
	return d.claimBatch(ctx, limit, nil)
}

// claimBatch is ClaimBatch with an optional prelude carried by its first round trip. When the server
// refuses the claim for what one locked task's rows hold, nothing of it was written; the tasks are then
// claimed one at a time so that only the one at fault is set aside (claimEach).
func (d *Dispatcher) claimBatch(ctx context.Context, limit int, pre *prelude) ([]*Attempt, []Result, error) {
	limit = min(MaxBatch, max(1, limit))
	attempts, settled, locked, err := d.claimOnce(ctx, limit, pre)
	if err != nil && refusedForRow(err) && len(locked) > 0 {
		return d.claimEach(ctx, limit, locked, err)
	}
	if err != nil {
		return nil, nil, d.failed("claim", err)
	}
	return attempts, settled, nil
}

// failed wraps a claim's error. A server that refused to write (SQLSTATE 25006) is a standby now, or
// was never the primary: the pool's connections to it are discarded, so that the next statement
// connects anew and, with target_session_attrs=read-write, finds the current primary. An error that a
// connection pooler's configuration caused says so, with the fix (ExplainPooler).
func (d *Dispatcher) failed(op string, err error) error {
	if sqlState(err) == sqlStateReadOnly {
		d.pool.Reset()
		return refuseReadOnly(op, err)
	}
	return ExplainPooler(fmt.Errorf("%s: %w", op, err), d.pool.Config().ConnConfig.User)
}

// claimOnce runs one claim transaction for up to limit tasks. locked lists the rows TaskClaim locked,
// also when a later statement of the transaction failed.
func (d *Dispatcher) claimOnce(ctx context.Context, limit int, pre *prelude) (attempts []*Attempt, settled []Result, locked []dbgen.TaskClaimRow, err error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	var committing *claimRecovery // set once the COMMIT is on its way
	defer func() {
		if err != nil && committing != nil && transient(err) {
			attempts, settled, err = d.recoverClaim(ctx, committing, err)
		}
	}()
	err = inClaimTx(ctx, d.pool, pre, func(q *dbgen.Queries, tx *claimTx) error {
		allowance, err := d.peekTokens(ctx, q)
		if err != nil {
			return err
		}
		var throttled map[string]bool // made by the first rateLimited
		rows, err := d.lockDue(ctx, q, limit, allowance, &throttled)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		locked = rows // takeTokens returns a new slice and leaves these rows as they are
		claimed := time.Now()
		var (
			expiredTokens []string
			start         = dbgen.TaskStartAttemptsParams{Worker: d.cfg.Worker, LeaseSeconds: d.cfg.Lease.Seconds()}
			decisions     = make(map[int64]delivery.ClaimDecision, len(rows))
			byID          = make(map[int64]dbgen.TaskClaimRow, len(rows))
		)
		for _, row := range rows {
			decisions[row.ID] = delivery.Decide(delivery.ClaimFacts{
				Uncertain: row.OutcomeUncertain, LeaseExpired: row.LeaseExpired,
				PrefEnabled: row.PrefEnabled, Expired: row.Expired,
				AttemptCount: int(row.AttemptCount), MaxAttempts: int(row.MaxAttempts),
				Mode: d.cfg.Routes[row.Channel].Mode, Contract: d.cfg.Routes[row.Channel].Contract,
				UncertainAge: seconds(row.UncertainAgeSeconds), ReceiptNoted: row.ReceiptNoted,
			})
		}
		// Calls on a limited channel need a token each; the tasks left without one stay as they are.
		if rows, err = d.takeTokens(ctx, q, rows, decisions, allowance, &throttled); err != nil {
			return err
		}
		for _, row := range rows {
			if row.LeaseExpired && row.HeldToken != nil {
				expiredTokens = append(expiredTokens, *row.HeldToken)
			}
			dec := decisions[row.ID]
			byID[row.ID] = row
			if dec.Kind == delivery.ClaimCall {
				start.IDs = append(start.IDs, row.ID)
				start.AttemptTokens = append(start.AttemptTokens, newToken())
				start.OutcomeUncertain = append(start.OutcomeUncertain, dec.Uncertain)
				start.Actions = append(start.Actions, string(dec.Action))
			}
		}
		if len(expiredTokens) > 0 {
			if _, err := q.AttemptMarkLeaseExpired(ctx, expiredTokens); err != nil {
				return fmt.Errorf("close expired attempts: %w", err)
			}
		}
		for _, row := range rows {
			if dec := decisions[row.ID]; dec.Kind != delivery.ClaimCall {
				res, err := d.settle(ctx, q, row, dec)
				if err != nil {
					return err
				}
				settled = append(settled, res)
			}
		}
		if len(start.IDs) == 0 {
			return nil
		}
		// The COMMIT travels with this statement and runs as soon as it succeeds. When the answer is lost
		// (the connection broke), the claim may have committed: recoverClaim asks by the tokens chosen here.
		tx.commitWithNext()
		attemptOf := func(s dbgen.TaskHeldByTokensRow) *Attempt {
			row, dec := byID[s.ID], decisions[s.ID]
			route := d.cfg.Routes[row.Channel]
			return &Attempt{
				TaskID: s.ID, Channel: row.Channel, Mode: route.Mode, Contract: route.Contract, No: int(s.AttemptCount),
				MaxAttempts: int(row.MaxAttempts), Token: s.AttemptToken, Action: dec.Action,
				PriorUncertain: dec.Uncertain, UncertainAge: seconds(row.UncertainAgeSeconds), claimed: claimed,
				LeaseUntil: s.LeaseUntil,
				Message: delivery.Message{Ref: row.Ref, IdempotencyKey: delivery.IdempotencyKey(row.Ref), To: row.Address, Body: row.Body,
					ExpiresAt: row.ExpiresAt, Action: dec.Action},
			}
		}
		committing = &claimRecovery{tokens: start.AttemptTokens, attemptOf: attemptOf}
		started, err := q.TaskStartAttempts(ctx, start)
		if err != nil {
			return fmt.Errorf("start attempts: %w", err)
		}
		if len(started) != len(start.IDs) {
			return fmt.Errorf("start attempts: %d of %d locked tasks started", len(started), len(start.IDs))
		}
		for _, s := range started {
			attempts = append(attempts, attemptOf(dbgen.TaskHeldByTokensRow{ID: s.ID, AttemptCount: s.AttemptCount,
				LeaseUntil: s.LeaseUntil, AttemptToken: s.AttemptToken}))
		}
		return nil
	})
	if err != nil {
		return nil, nil, locked, err
	}
	return attempts, settled, locked, nil
}

// claimRecovery is what recoverClaim needs of a claim whose COMMIT was sent: the attempt tokens it
// chose, and how to make an Attempt of a task found holding one.
type claimRecovery struct {
	tokens    []string
	attemptOf func(dbgen.TaskHeldByTokensRow) *Attempt
}

// recoverClaim finds out whether a claim whose commit's answer was lost (claimErr, transient)
// committed: the tasks that hold the tokens it chose are its own, under a live lease, and no call was
// made for them yet, so they are handed back to be called. The claim's tasks settled without a call are
// then written too; their results are not reported. When the claim did not commit, or the question
// cannot be asked, the claim fails with claimErr as before, and a claim that committed unseen is
// recovered after its lease, like a crash.
func (d *Dispatcher) recoverClaim(ctx context.Context, c *claimRecovery, claimErr error) ([]*Attempt, []Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	// The pool's other connections may have broken with the claim's (a failover, a restart): the
	// question is asked again on a new one, a few times.
	held, err := dbgen.New(d.pool).TaskHeldByTokens(ctx, c.tokens)
	for try := 0; transient(err) && try < 3 && ctx.Err() == nil; try++ {
		time.Sleep(finishRetryDelay(try))
		held, err = dbgen.New(d.pool).TaskHeldByTokens(ctx, c.tokens)
	}
	if err != nil || len(held) == 0 {
		return nil, nil, claimErr
	}
	attempts := make([]*Attempt, len(held))
	for i, h := range held {
		attempts[i] = c.attemptOf(h)
	}
	if d.cfg.ClaimRecovered != nil {
		d.cfg.ClaimRecovered(len(attempts), claimErr)
	}
	return attempts, nil, nil
}

// lockDue locks up to limit due tasks of this worker's channels, one channel at a time (TaskClaim walks
// one channel's part of the claim indexes), starting with the channel after the one the previous claim
// started with, so that a busy channel does not starve the others. A channel in allowance (it has a
// rate-limit bucket) gets no more tasks locked than its whole tokens, and none looked at without one.
func (d *Dispatcher) lockDue(ctx context.Context, q *dbgen.Queries, limit int, allowance map[string]int, throttled *map[string]bool) ([]dbgen.TaskClaimRow, error) {
	var rows []dbgen.TaskClaimRow
	start := int(d.turn.Add(1))
	for i := range d.channels {
		ch := d.channels[(start+i)%len(d.channels)]
		want := limit - len(rows)
		tokens, limited := allowance[ch]
		if limited && tokens < 1 {
			d.rateLimited(ch, throttled)
			continue
		}
		if limited {
			want = min(want, tokens)
		}
		got, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channel: ch, MaxTasks: int32(want)})
		if err != nil {
			return rows, fmt.Errorf("lock due tasks of %s: %w", ch, err)
		}
		if limited && want < limit-len(rows) && len(got) == want {
			d.rateLimited(ch, throttled) // as many tasks as tokens: more may be waiting
		}
		if rows = append(rows, got...); len(rows) == limit {
			break
		}
	}
	return rows, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// MaxBatch bounds how many tasks one claim locks.
const MaxBatch = 1000

// settle applies a claim-time decision not to call: park, or a state written with its SKIP attempt.
func (d *Dispatcher) settle(ctx context.Context, q *dbgen.Queries, row dbgen.TaskClaimRow, dec delivery.ClaimDecision) (Result, error) {
	result := Result{TaskID: row.ID, Channel: row.Channel, Detail: dec.Reason}
	if dec.Kind == delivery.ClaimReceipt {
		applied, err := q.ReceiptApply(ctx, dbgen.ReceiptApplyParams{TaskID: row.ID,
			Note: "settled at claim by a receipt noted while the task was held"})
		if err == nil && delivery.ReceiptEffect(applied.Effect) != delivery.ReceiptSettled {
			err = fmt.Errorf("%w: the receipt's effect was %s", errNotSettleable, applied.Effect)
		}
		if err != nil {
			return result, fmt.Errorf("settle task %d by its receipt: %w", row.ID, err)
		}
		result.Kind, result.Action, result.Outcome = ResultSent, delivery.ActionReceipt, delivery.OutcomeReceiptAccepted
		return result, nil
	}
	if dec.Kind == delivery.ClaimPark {
		result.Kind = ResultParked
		parked, err := q.TaskPark(ctx, dbgen.TaskParkParams{ID: row.ID, LastError: dec.Reason})
		if err == nil && parked != 1 {
			err = errNotSettleable
		}
		if err != nil {
			return result, fmt.Errorf("park task %d: %w", row.ID, err)
		}
		return result, nil
	}
	no, err := q.TaskSettleWithoutCall(ctx, dbgen.TaskSettleWithoutCallParams{
		ID: row.ID, State: string(dec.State), NeedsReview: dec.State == delivery.StateUnknown,
		OutcomeUncertain: dec.Uncertain, LastError: dec.Reason,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = errNotSettleable
	}
	if err != nil {
		return result, fmt.Errorf("settle task %d: %w", row.ID, err)
	}
	result.Kind, result.Attempt, result.Action, result.Outcome = settledKind(dec.State), int(no), delivery.ActionSkip, dec.Outcome
	return result, q.AttemptRecordSkip(ctx, dbgen.AttemptRecordSkipParams{
		TaskID: row.ID, AttemptNo: no, Worker: d.cfg.Worker, Outcome: string(dec.Outcome), Error: dec.Reason,
	})
}

// errNotSettleable: the settle's or park's own guard matched nothing. The claim locked the row, so it can
// only be a task this claim may not settle (neither due nor held under an expired lease).
var errNotSettleable = errors.New("0 rows: the task is neither due nor held under an expired lease")

func settledKind(s delivery.State) ResultKind {
	if s == delivery.StateUnknown {
		return ResultParked
	}
	return ResultKind(s)
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

// FinishBatch is the second correctness check: it maps each observation to the task's next state
// (Next) and, in one statement (TaskFinish), writes it only where the attempt's token is still the
// task's valid one; those attempts get their outcome. Superseded attempts keep their observation as late_outcome and
// their result is STALE. The results are in the order of attempts. When the server refuses the statement
// for what a row holds (rowFault), each attempt is finished on its own, so one bad row costs only its own
// observation: that attempt's result is UNRECORDED. A 429 on a rate-limited channel first pauses that
// channel for every worker (pauseThrottled).
func (d *Dispatcher) FinishBatch(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	d.pauseThrottled(ctx, attempts, obs)
	results, err := d.finishBatch(ctx, attempts, obs)
	d.disableUnregistered(ctx, results, obs)
	return results, err
}

// disableUnregistered switches off the preferences whose address a provider said is gone
// (DisableUnregistered), for the attempts whose rejection was recorded (FAILED): one short statement
// each, after the finish, because such answers are rare. A failure to switch one off is said in its
// result's Detail; the task's outcome stands either way.
func (d *Dispatcher) disableUnregistered(ctx context.Context, results []Result, obs []delivery.Observation) {
	if !d.cfg.DisableUnregistered || len(results) != len(obs) {
		return
	}
	for i := range results {
		r := &results[i]
		if !obs[i].Unregistered || r.Kind != ResultFailed || r.Outcome != delivery.OutcomeRejected {
			continue
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
		_, err := dbgen.New(d.pool).PrefDisableByTask(dctx, r.TaskID)
		cancel()
		switch {
		case err == nil:
			r.PrefDisabled = true
		case !errors.Is(err, pgx.ErrNoRows): // no row: the preference is off already
			r.Detail += "; the preference could not be switched off: " + err.Error()
		}
	}
}

// finishBatch is FinishBatch without the pause.
func (d *Dispatcher) finishBatch(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return nil, err
	}
	rows, err := d.finish(ctx, attempts, params, nil)
	if rowFault(err) {
		return d.finishEach(ctx, attempts, params, results), nil
	}
	return finishResults(attempts, results, rows, err)
}

// finish runs TaskFinish, one autocommit statement: the token-guarded task updates and the attempt rows
// they decide. A finish that failed transiently (a broken connection, a server restarting or failed
// over: transient) may or may not have committed; TaskFinish is idempotent, so it is sent again, with
// backoff, for as long as the attempts' leases leave time for it (finishDeadline). Only then are the
// tasks left to lease expiry, as uncertain: without the retry a NONE-channel task whose call was
// accepted would be parked for a human because the database blinked. A first failure that came from a
// finish sent ahead of a claim (first) is retried the same way. The retries are not cancelled with ctx:
// a stopping worker still records its answers.
func (d *Dispatcher) finish(ctx context.Context, attempts []*Attempt, params dbgen.TaskFinishParams, err error) ([]dbgen.TaskFinishRow, error) {
	deadline := finishDeadline(attempts, d.cfg.Lease)
	var rows []dbgen.TaskFinishRow
	if err == nil { // the first try goes whatever the lease: a superseded holder's finish keeps its late outcome
		rows, err = d.finishTry(ctx, params, time.Now().Add(d.cfg.DBTimeout))
	}
	for try := 0; transient(err); try++ {
		if sqlState(err) == sqlStateReadOnly {
			d.pool.Reset() // a standby now: reconnect, to the new primary
		}
		wait := finishRetryDelay(try)
		if time.Until(deadline) < wait+minFinishTry {
			return nil, fmt.Errorf("%w (sent %d times; no time left before the lease runs out)", err, try+1)
		}
		if d.cfg.FinishRetried != nil {
			d.cfg.FinishRetried(len(attempts), try, err)
		}
		time.Sleep(wait)
		rows, err = d.finishTry(ctx, params, deadline)
	}
	return rows, err
}

// finishTry sends TaskFinish once, bounded by DBTimeout and the deadline.
func (d *Dispatcher) finishTry(ctx context.Context, params dbgen.TaskFinishParams, deadline time.Time) ([]dbgen.TaskFinishRow, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(d.cfg.DBTimeout, time.Until(deadline)))
	defer cancel()
	return dbgen.New(d.pool).TaskFinish(ctx, params)
}

// minFinishTry is the least time worth a finish's try: less than this before the lease ends and the
// tasks are left to lease expiry.
const minFinishTry = 500 * time.Millisecond

// finishDeadline is when the earliest lease of attempts ends, on this process's clock: the lease
// started on the database clock during the claim, before the claim returned (claimed), so this is no
// earlier than the real end, and a finish sent after it is fenced by the token (it reads STALE).
func finishDeadline(attempts []*Attempt, lease time.Duration) time.Time {
	var deadline time.Time
	for _, a := range attempts {
		if end := a.claimed.Add(lease); deadline.IsZero() || end.Before(deadline) {
			deadline = end
		}
	}
	return deadline
}

// finishRetryDelay is the wait before retry number try+1 of a finish: 100 ms doubled per retry, at most
// 2 s, spread.
func finishRetryDelay(try int) time.Duration {
	d := 100 * time.Millisecond << min(try, 5)
	return spread(min(d, 2*time.Second))
}

// Handoff is what FinishBatchThenClaim did: one batch finished, the next one claimed.
type Handoff struct {
	Finished  []Result   // the finished batch's results, in the order of its attempts (UNRECORDED: see FinishBatch)
	FinishErr error      // the finish failed: its tasks stay SENDING, recovered after their lease
	Next      []*Attempt // the next batch: call, then finish
	Settled   []Result   // tasks of the next claim decided without a call
	ClaimErr  error
}

// FinishBatchThenClaim is FinishBatch followed by ClaimBatch with one round trip fewer: TaskFinish
// travels in the same write as the claim's BEGIN and first statement, in its own implicit transaction
// ahead of them (prelude). The finish commits before the claim begins; a failed claim does not undo it
// and a failed finish does not stop the claim. A worker that is stopping calls FinishBatch alone
// instead. On connections that do not prepare statements (pipelines) it is FinishBatch then
// ClaimBatch. As in FinishBatch, a 429 on a rate-limited channel first pauses that channel.
func (d *Dispatcher) FinishBatchThenClaim(ctx context.Context, attempts []*Attempt, obs []delivery.Observation, limit int) Handoff {
	h := d.finishBatchThenClaim(ctx, attempts, obs, limit)
	d.disableUnregistered(ctx, h.Finished, obs)
	return h
}

func (d *Dispatcher) finishBatchThenClaim(ctx context.Context, attempts []*Attempt, obs []delivery.Observation, limit int) Handoff {
	d.pauseThrottled(ctx, attempts, obs) // before the claim, so that the claim sees the pause
	var h Handoff
	apart := func() Handoff {
		h.Finished, h.FinishErr = d.finishBatch(ctx, attempts, obs)
		h.Next, h.Settled, h.ClaimErr = d.ClaimBatch(ctx, limit)
		return h
	}
	if !d.pipelines {
		return apart()
	}
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return apart() // FinishBatch reports the same error; the claim goes on
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	var (
		statement recorder
		rows      []dbgen.TaskFinishRow
	)
	_, _ = dbgen.New(&statement).TaskFinish(fctx, params)
	pre := &prelude{ctx: fctx, sql: statement.sql, args: statement.args, read: func(r pgx.Rows) (err error) {
		rows, err = dbgen.New(replayed{sql: statement.sql, rows: r}).TaskFinish(fctx, params)
		return err
	}}
	h.Next, h.Settled, h.ClaimErr = d.claimBatch(ctx, limit, pre)
	if !pre.sent { // the claim failed before its first round trip: the finish goes alone
		h.Finished, h.FinishErr = d.finishBatch(ctx, attempts, obs)
		return h
	}
	err = pre.err
	if transient(err) { // it may have committed: send it again (TaskFinish is idempotent)
		rows, err = d.finish(ctx, attempts, params, err)
	}
	if rowFault(err) {
		h.Finished = d.finishEach(ctx, attempts, params, results)
		return h
	}
	h.Finished, h.FinishErr = finishResults(attempts, results, rows, err)
	return h
}

// finishParams maps each observation to its task's next state: TaskFinish's arguments, and the results
// to report if the token guard holds.
func (d *Dispatcher) finishParams(attempts []*Attempt, obs []delivery.Observation) (dbgen.TaskFinishParams, []Result, error) {
	finish := dbgen.TaskFinishParams{}
	if len(attempts) != len(obs) {
		return finish, nil, fmt.Errorf("finish: %d attempts but %d observations", len(attempts), len(obs))
	}
	results := make([]Result, len(attempts))
	for i, a := range attempts {
		o := obs[i]
		t := delivery.Next(delivery.Facts{Outcome: o.Outcome, PriorUncertain: a.PriorUncertain, BudgetLeft: a.No < a.MaxAttempts,
			Mode: a.Mode, Contract: a.Contract, UncertainAge: a.UncertainAge + time.Since(a.claimed)})
		results[i] = Result{Kind: resultKind(t), TaskID: a.TaskID, Channel: a.Channel, Attempt: a.No, Action: a.Action,
			Outcome: o.Outcome, Token: a.Token, Detail: o.Detail}
		retry := -1.0
		if t.Retry {
			retry = spread(max(d.cfg.Backoff.Delay(a.No, o.RetryAfter), t.NotBefore)).Seconds()
		}
		finish.IDs = append(finish.IDs, a.TaskID)
		finish.AttemptTokens = append(finish.AttemptTokens, a.Token)
		finish.States = append(finish.States, string(t.State))
		finish.OutcomeUncertain = append(finish.OutcomeUncertain, t.Uncertain)
		finish.NeedsReview = append(finish.NeedsReview, t.Park)
		finish.ProviderMsgIDs = append(finish.ProviderMsgIDs, truncate(o.ProviderMsgID, 500))
		finish.LastErrors = append(finish.LastErrors, errorText(o))
		finish.RetryAfterSeconds = append(finish.RetryAfterSeconds, retry)
		finish.Outcomes = append(finish.Outcomes, string(o.Outcome))
		finish.Errors = append(finish.Errors, truncate(o.Detail, MaxNoteLength))
	}
	return finish, results, nil
}

// finishResults checks TaskFinish's rows against the attempts: an attempt whose token no longer held
// is STALE. A failure that a connection pooler's configuration caused says so (ExplainPooler).
func finishResults(attempts []*Attempt, results []Result, rows []dbgen.TaskFinishRow, err error) ([]Result, error) {
	if err == nil && len(rows) != len(attempts) {
		err = fmt.Errorf("%d rows for %d attempts", len(rows), len(attempts))
	}
	if err != nil {
		return nil, ExplainPooler(fmt.Errorf("finish: %w", err), "")
	}
	current := make(map[int64]bool, len(rows))
	for _, r := range rows {
		current[r.ID] = r.Current
	}
	for i, a := range attempts {
		if !current[a.TaskID] {
			results[i].Kind = ResultStale
		}
	}
	return results, nil
}

func resultKind(t delivery.Transition) ResultKind {
	if t.Park {
		return ResultParked
	}
	return ResultKind(t.State)
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
	return truncate(text, MaxNoteLength)
}

// truncate makes s storable as PostgreSQL text of at most n characters: whatever a channel answered,
// a finish must not fail on it (and lose the observations of its whole batch). Invalid UTF-8 and NUL,
// which PostgreSQL text refuses, become "?".
func truncate(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "?")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// spread lengthens a wait d by up to a quarter, at random, so that what waits together (a window's
// retries after a provider's outage, the workers of a database that comes back) does not go again in
// lockstep. Never shorter: a wait is at least what it was computed to be (a Retry-After, a settle
// time). The same rule as the worker loop's polls and backoff (worker.spread).
func spread(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*float64(d)/4)
}

// newToken is a random attempt token (a version 4 UUID), chosen by the claimer: TaskStartAttempts sets
// it, and TaskHeldByTokens finds the claim by it when the answer to its commit was lost.
func newToken() string {
	var b [16]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux; a token must never repeat
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
