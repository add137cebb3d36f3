package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// answering is a channel that answers every call with the same observation.
type answering service.Observation

func (a answering) Send(context.Context, service.Message) service.Observation {
	return service.Observation(a)
}
func (a answering) Query(context.Context, string) service.Observation { return service.Observation(a) }

// A channel's answer is stored whatever bytes it holds: PostgreSQL text refuses NUL and invalid UTF-8,
// and a refused write would lose every observation of the batch.
func TestFinishStoresAnyAnswer(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.user("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	hostile := answering{Outcome: service.OutcomeAccepted, ProviderMsgID: "id\x00with\xffbytes" + strings.Repeat("x", 600),
		Detail: "detail\x00\xfe" + strings.Repeat("é", 3000)}
	d, err := service.NewDispatcher(e.pool, service.DispatcherConfig{Worker: "w",
		Routes: map[string]service.Route{"push": {Mode: service.ModeIdempotent, Client: hostile}}})
	is.NoErr(err)
	res, err := d.RunOnce(e.ctx)
	is.NoErr(err)                          // the finish does not fail
	is.Equal(res.Kind, service.ResultSent) // and records the acceptance
	task := e.task(id)
	is.True(strings.HasPrefix(task.ProviderMsgID, "id?with?bytes")) // NUL and invalid bytes replaced
	is.Equal(len([]rune(task.ProviderMsgID)), 500)                  // cut to the column's bound
}
