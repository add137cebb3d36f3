package service

import (
	"context"

	"github.com/notifierhq/notifier/dbgen"
)

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
			results[i].Kind, results[i].Err = ResultUnrecorded, err
			results[i].Detail = truncate(err.Error(), MaxNoteLength)
		}
	}
	return results
}
