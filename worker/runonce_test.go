package worker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// onceDispatcher answers one claim and one finish as the test says, and notes what it was asked.
type onceDispatcher struct {
	attempts  []*service.Attempt
	settled   []service.Result
	claimErr  error
	finished  []service.Result // the finish's results; nil: one SENT per attempt
	finishErr error

	limits []int
	called []int64
	finish [][]delivery.Observation
}

func (d *onceDispatcher) ClaimBatch(_ context.Context, limit int) ([]*service.Attempt, []service.Result, error) {
	d.limits = append(d.limits, limit)
	return d.attempts, d.settled, d.claimErr
}

func (d *onceDispatcher) Call(_ context.Context, a *service.Attempt) delivery.Observation {
	d.called = append(d.called, a.TaskID)
	return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "m-" + a.Channel}
}

func (d *onceDispatcher) FinishBatch(_ context.Context, attempts []*service.Attempt, obs []delivery.Observation) ([]service.Result, error) {
	d.finish = append(d.finish, obs)
	if d.finishErr != nil {
		return nil, d.finishErr
	}
	if d.finished != nil {
		return d.finished, nil
	}
	var out []service.Result
	for _, a := range attempts {
		out = append(out, service.Result{Kind: service.ResultSent, TaskID: a.TaskID, Outcome: delivery.OutcomeAccepted})
	}
	return out, nil
}

// RunOnce claims one task, calls it and records its answer, and tells every way that can end apart:
// the result it returns, the error beside it, and the lines it logs.
func TestRunOnce(t *testing.T) {
	one := []*service.Attempt{{TaskID: 7, Channel: "push", No: 2, Token: "0123456789ab", Action: delivery.ActionSend}}
	refused := errors.New("ERROR: refused (SQLSTATE 23514)")
	down := errors.New("connection refused")
	for _, c := range []struct {
		name    string
		d       *onceDispatcher
		kind    service.ResultKind
		task    int64
		err     error  // errors.Is the returned error; nil: none
		errText string // the returned error's text holds it
		calls   int
		log     []string // each line holds the one at its index
	}{
		{name: "nothing due", d: &onceDispatcher{}, kind: service.ResultNothing},
		{name: "the claim fails", d: &onceDispatcher{claimErr: down}, kind: service.ResultNothing, err: down},
		{name: "one task sent", d: &onceDispatcher{attempts: one}, kind: service.ResultSent, task: 7, calls: 1,
			log: []string{"msg=CLAIMED task=7 channel=push attempt=2 action=SEND uncertain=false token=01234567",
				"msg=CALLED task=7 attempt=2 action=SEND outcome=ACCEPTED provider_msg_id=m-push",
				"msg=RESULT result=SENT task=7 attempt=0 action=\"\" outcome=ACCEPTED token=\"\""}},
		{name: "the finish fails", d: &onceDispatcher{attempts: one, finishErr: down}, kind: service.ResultNothing, err: down, calls: 1,
			log: []string{"msg=CLAIMED", "msg=CALLED", "level=ERROR msg=\"finish failed; the tasks will be recovered after their lease\" tasks=1"}},
		{name: "its row is refused", d: &onceDispatcher{attempts: one, finished: []service.Result{{Kind: service.ResultUnrecorded, TaskID: 7, Err: refused}}},
			kind: service.ResultUnrecorded, task: 7, err: refused, calls: 1,
			log: []string{"msg=CLAIMED", "msg=CALLED", "level=ERROR msg=\"finish failed for this task"}},
		{name: "settled without a call", d: &onceDispatcher{settled: []service.Result{{Kind: service.ResultFailed, TaskID: 3, Channel: "sms"}}},
			kind: service.ResultFailed, task: 3,
			log: []string{"msg=RESULT result=FAILED task=3 channel=sms"}},
		{name: "set aside by the claim", d: &onceDispatcher{settled: []service.Result{{Kind: service.ResultSetAside, TaskID: 4, Err: refused}}},
			kind: service.ResultSetAside, task: 4, err: refused, errText: "claim: task 4 set aside until the longest backoff has passed",
			log: []string{"level=ERROR msg=\"claim refused by the database for this task's own rows; set aside, the queue goes on\" task=4"}},
		{name: "settled, then one sent", d: &onceDispatcher{attempts: one, settled: []service.Result{{Kind: service.ResultFailed, TaskID: 3}}},
			kind: service.ResultFailed, task: 3, calls: 1, // the first result is the one returned; both are logged
			log: []string{"msg=RESULT result=FAILED task=3", "msg=CLAIMED task=7", "msg=CALLED task=7", "msg=RESULT result=SENT task=7"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			var buf bytes.Buffer
			res, err := RunOnce(context.Background(), c.d, slog.New(slog.NewTextHandler(&buf, nil)), nil)
			is.Equal(res.Kind, c.kind)
			is.Equal(res.TaskID, c.task)
			if c.err == nil {
				is.NoErr(err)
			} else {
				is.True(errors.Is(err, c.err)) // the error itself, not its text
			}
			if c.errText != "" {
				is.True(strings.Contains(err.Error(), c.errText))
			}
			is.Equal(c.d.limits, []int{1}) // one claim of one task
			is.Equal(len(c.d.called), c.calls)
			is.Equal(len(c.d.finish), c.calls) // a finish per claim that had a call, none otherwise
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(c.log) == 0 {
				is.Equal(buf.String(), "") // nothing happened, nothing logged
				return
			}
			is.Equal(len(lines), len(c.log))
			for i, want := range c.log {
				if !strings.Contains(lines[i], want) {
					t.Errorf("log line %d: %s\nwant it to hold: %s", i, lines[i], want)
				}
			}
		})
	}
}

// RunOnce logs to slog's default logger when it is given none, and reports to no Observer without one.
func TestRunOnceDefaultsItsLoggerAndObserver(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	d := &onceDispatcher{attempts: []*service.Attempt{{TaskID: 9, Channel: "push", No: 1, Action: delivery.ActionSend}}}
	res, err := RunOnce(context.Background(), d, nil, nil)
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(strings.Count(buf.String(), "msg=CLAIMED"), 1) // on the default logger
}
