package service

// The claim's policy, the first correctness check: ClaimBatch locks due tasks with FOR UPDATE SKIP
// LOCKED, settles those that need no call (suppressed, expired, parked) and hands out the rest with a
// lease and a fresh attempt token (claimOnce, on a pipelineTx: pipelinetx.go, two round trips). What
// happens when a claim does not go as planned (a lost COMMIT answer, a refused row) is in
// claimfallback.go.

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// ClaimBatch is the first correctness check. In one transaction it locks up to max due tasks (SENDING
// tasks whose lease expired first, then the longest-waiting PENDING or UNKNOWN ones) with SKIP LOCKED,
// closes the open attempts of expired leases as LEASE_EXPIRED, decides per task (Decide), and for the
// tasks to call sets a fresh token and lease and opens their attempt rows. After the commit the caller
// holds each returned Attempt's only valid token until its lease ends. Tasks settled without a call
// come back as Results. Two round trips when tasks are started: BEGIN with TaskClaim, then
// TaskStartAttempts with COMMIT (pipelineTx, pipelinetx.go).
//
// When the server refuses the claim for what one locked task's rows hold, nothing of it was written; the
// tasks are then claimed one at a time so that only the one at fault is set aside (claimEach).
func (d *Dispatcher) ClaimBatch(ctx context.Context, limit int) ([]*Attempt, []Result, error) {
	limit = min(MaxBatch, max(1, limit))
	attempts, settled, locked, err := d.claimOnce(ctx, limit)
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
func (d *Dispatcher) claimOnce(ctx context.Context, limit int) (attempts []*Attempt, settled []Result, locked []dbgen.TaskClaimRow, err error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	var committing *claimRecovery // set once the COMMIT is on its way
	defer func() {
		if err != nil && committing != nil && transient(err) {
			attempts, settled, err = d.recoverClaim(ctx, committing, err)
		}
	}()
	err = inPipelineTx(ctx, d.pool, func(q *dbgen.Queries, tx *pipelineTx) error {
		allowance, err := d.peekTokens(ctx, q)
		if err != nil {
			return err
		}
		run := &claimRun{allowance: allowance}
		rows, err := d.lockDue(ctx, q, limit, run)
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
				PrefEnabled: row.PrefEnabled, Expired: row.Expired, Cancelled: row.Cancelled,
				AttemptCount: int(row.AttemptCount), AccountRefusals: int(row.AccountRefusals), MaxAttempts: int(row.MaxAttempts),
				Mode: d.cfg.Routes[row.Channel].Mode, Contract: d.cfg.Routes[row.Channel].Contract,
				UncertainAge: seconds(row.UncertainAgeSeconds), ReceiptNoted: row.ReceiptNoted,
			})
		}
		// Calls on a limited channel need a token each; the tasks left without one stay as they are.
		if rows, err = d.takeTokens(ctx, q, rows, decisions, run); err != nil {
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
			return d.releaseUnusedProbe(ctx, q, rows)
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
				PriorUncertain: dec.Uncertain, AccountRefusals: int(row.AccountRefusals), Probe: row.Probe,
				UncertainAge: seconds(row.UncertainAgeSeconds), claimed: claimed,
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

// claimRun is what one claim transaction learns of the rate limits as it goes: the tokens each limited
// channel had when it began (RateLimitPeek), and the limited channels it found short of tokens, each
// reported to the observer once.
type claimRun struct {
	allowance map[string]int
	throttled map[string]bool
}

// rateLimited reports a limited channel that had tasks left over for want of tokens, once per claim.
func (d *Dispatcher) rateLimited(run *claimRun, channel string) {
	if run.throttled[channel] {
		return
	}
	if run.throttled == nil {
		run.throttled = map[string]bool{}
	}
	run.throttled[channel] = true
	d.cfg.Observer.RateLimited(channel)
}

// lockDue locks up to limit due tasks of this worker's channels, one channel at a time (TaskClaim walks
// one channel's part of the claim indexes), starting with the channel after the one the previous claim
// started with, so that a busy channel does not starve the others. A channel in run's allowance (it has
// a rate-limit bucket) gets no more tasks locked than its whole tokens, and none looked at without one.
func (d *Dispatcher) lockDue(ctx context.Context, q *dbgen.Queries, limit int, run *claimRun) ([]dbgen.TaskClaimRow, error) {
	var rows []dbgen.TaskClaimRow
	start := int(d.turn.Add(1))
	for i := range d.channels {
		ch := d.channels[(start+i)%len(d.channels)]
		want := limit - len(rows)
		tokens, limited := run.allowance[ch]
		if limited && tokens < 1 {
			d.rateLimited(run, ch)
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
			d.rateLimited(run, ch) // as many tasks as tokens: more may be waiting
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
