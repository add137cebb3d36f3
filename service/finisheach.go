package service

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/notifierhq/notifier/dbgen"
)

// rowFault reports whether the server refused a finish for what one of its rows holds (a data
// exception, a constraint, a trigger's exception) or rolled it back to break a deadlock. The statement
// is then certainly not written, and finishing each row alone saves the rows that are not at fault.
// Anything else fails the whole finish as before: a broken connection leaves the outcome unknown (a
// retry would read a recorded row as STALE), and the server's own troubles (a full disk, a timeout, a
// missing privilege) would refuse every row alike.
func rowFault(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", // data exception
		"23", // integrity constraint violation
		"40", // transaction rollback: deadlock, serialization failure
		"P0": // raised by PL/pgSQL
		return true
	}
	return false
}

// finishEach finishes each attempt of a batch whose finish the server refused, one TaskFinish per
// attempt under one DBTimeout. An attempt whose own finish fails is UNRECORDED: it stays SENDING with
// its token and is recovered after its lease, as after a crash.
func (d *Dispatcher) finishEach(ctx context.Context, attempts []*Attempt, params dbgen.TaskFinishParams, results []Result) []Result {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	q := dbgen.New(d.pool)
	for i := range attempts {
		one := i + 1
		rows, err := q.TaskFinish(ctx, dbgen.TaskFinishParams{
			IDs:               params.IDs[i:one],
			AttemptTokens:     params.AttemptTokens[i:one],
			States:            params.States[i:one],
			OutcomeUncertain:  params.OutcomeUncertain[i:one],
			NeedsReview:       params.NeedsReview[i:one],
			ProviderMsgIDs:    params.ProviderMsgIDs[i:one],
			LastErrors:        params.LastErrors[i:one],
			RetryAfterSeconds: params.RetryAfterSeconds[i:one],
			Outcomes:          params.Outcomes[i:one],
			Errors:            params.Errors[i:one],
		})
		if _, err := finishResults(attempts[i:one], results[i:one], rows, err); err != nil {
			results[i].Kind = ResultUnrecorded
			results[i].Detail = truncate(err.Error(), MaxNoteLength)
		}
	}
	return results
}
