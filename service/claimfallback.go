package service

// When a claim does not go as planned: its COMMIT's answer was lost (recoverClaim finds out by the
// tokens whether it committed), or the server refused it for what one locked row holds (claimEach
// claims the tasks one at a time, so that only the one at fault is set aside: one bad row costs only
// itself).

import (
	"context"
	"fmt"
	"time"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

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
	d.cfg.Observer.ClaimRecovered(len(attempts), claimErr)
	return attempts, nil, nil
}

// claimEach claims again, one task per transaction, after a claim of the tasks in locked was refused
// for what one of their rows holds (refused). Nothing of the refused claim was written, so the tasks
// are still due: each one-task claim either succeeds or names the task at fault, which is set aside
// (TaskSetAside) so that it no longer stands first in line. One bad row costs only itself: the rest of
// the queue flows, up to limit tasks in this call.
//
// A claim failing for any other reason ends the loop: with what was claimed so far when there is
// something (an Attempt returned with an error would be held but never called), else with the error.
func (d *Dispatcher) claimEach(ctx context.Context, limit int, locked []dbgen.TaskClaimRow, refused error) ([]*Attempt, []Result, error) {
	var (
		attempts []*Attempt
		settled  []Result
	)
	if len(locked) == 1 { // the one task of this claim is at fault
		res, err := d.setAside(ctx, locked[0], refused)
		if err != nil {
			return nil, nil, err
		}
		settled = append(settled, res)
	}
	// Every task of the refused claim, and limit tasks besides, may need its own claim.
	for tries := 0; len(attempts)+len(settled) < limit && tries < limit+len(locked); tries++ {
		a, s, one, err := d.claimOnce(ctx, 1)
		switch {
		case err == nil && len(a)+len(s) == 0:
			return attempts, settled, nil // nothing due any more
		case err == nil:
			attempts, settled = append(attempts, a...), append(settled, s...)
		case refusedForRow(err) && len(one) == 1:
			res, aerr := d.setAside(ctx, one[0], err)
			if aerr != nil {
				return d.partial(attempts, settled, aerr)
			}
			settled = append(settled, res)
		default:
			return d.partial(attempts, settled, fmt.Errorf("claim: %w", err))
		}
	}
	return attempts, settled, nil
}

// partial returns what a claim loop got before err, or err when it got nothing.
func (d *Dispatcher) partial(attempts []*Attempt, settled []Result, err error) ([]*Attempt, []Result, error) {
	if len(attempts)+len(settled) > 0 {
		return attempts, settled, nil // err recurs on the next claim, which reports it
	}
	return nil, nil, err
}

// setAside moves a task the server refused to claim out of the claim's way for the longest backoff,
// in its own statement, and reports it as a SET_ASIDE result (logged as an error by the worker). When
// that statement fails, its error is the claim's: the refusal, and the failure to set the task aside.
func (d *Dispatcher) setAside(ctx context.Context, t dbgen.TaskClaimRow, refused error) (Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	delay := d.cfg.Backoff.Max
	why := delivery.Truncate(fmt.Sprintf("SET_ASIDE: the database refused to claim this task: %v; tried again after %s",
		refused, delay.Round(time.Second)), MaxNoteLength)
	if _, err := dbgen.New(d.pool).TaskSetAside(ctx, dbgen.TaskSetAsideParams{
		ID: t.ID, DelaySeconds: delay.Seconds(), LastError: why,
	}); err != nil {
		return Result{}, fmt.Errorf("claim: %w (and setting task %d aside failed: %w)", refused, t.ID, err)
	}
	return Result{Kind: ResultSetAside, TaskID: t.ID, Channel: t.Channel, Detail: why, Err: refused}, nil
}
