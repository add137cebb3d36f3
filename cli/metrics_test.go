package cli

import (
	"context"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
)

// acceptingChannel accepts every send and finds every query.
type acceptingChannel struct{}

func (acceptingChannel) Send(context.Context, delivery.Message) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeAccepted}
}

func (acceptingChannel) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFound}
}

// TestCallsAreCountedUnderTheirAction: a TOPIC_RESEND is counted as one, not as a SEND (it was, so a
// dashboard could not tell Web Push resends from first sends); a send without an action is a SEND.
func TestCallsAreCountedUnderTheirAction(t *testing.T) {
	is := is.New(t)
	m := newMetrics()
	ch := measuredChannel{name: "browser", next: acceptingChannel{}, m: m}
	ctx := context.Background()
	ch.Send(ctx, delivery.Message{Action: delivery.ActionSend})
	ch.Send(ctx, delivery.Message{Action: delivery.ActionTopicResend})
	ch.Send(ctx, delivery.Message{Action: delivery.ActionTopicResend})
	ch.Send(ctx, delivery.Message{})
	ch.Query(ctx, "task-1")
	calls, durations := map[string]float64{}, map[string]uint64{}
	families, err := m.registry.Gather()
	is.NoErr(err)
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			labels := ""
			for _, l := range metric.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			switch f.GetName() {
			case "notifier_calls_total":
				calls[labels] = metric.GetCounter().GetValue()
			case "notifier_call_duration_seconds":
				durations[labels] = metric.GetHistogram().GetSampleCount()
			}
		}
	}
	is.Equal(calls, map[string]float64{
		"action=SEND channel=browser outcome=ACCEPTED ":         2, // the send and the one without an action
		"action=TOPIC_RESEND channel=browser outcome=ACCEPTED ": 2, // each resend under its own label
		"action=QUERY channel=browser outcome=QUERY_FOUND ":     1, // the query
	})
	is.Equal(durations, map[string]uint64{"action=SEND channel=browser ": 2, "action=TOPIC_RESEND channel=browser ": 2,
		"action=QUERY channel=browser ": 1}) // timed under the same actions
}
