package cli

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestCallsAreCountedUnderTheirAction: a TOPIC_RESEND is counted as one, not as a SEND (it was, so a
// dashboard could not tell Web Push resends from first sends); a send without an action is a SEND.
func TestCallsAreCountedUnderTheirAction(t *testing.T) {
	is := is.New(t)
	m := newMetrics()
	o := workObserver{log: slog.New(slog.NewTextHandler(io.Discard, nil)), m: m}
	accepted := delivery.Observation{Outcome: delivery.OutcomeAccepted}
	for _, action := range []delivery.Action{delivery.ActionSend, delivery.ActionTopicResend, delivery.ActionTopicResend, ""} {
		o.Called(service.CallEvent{Attempt: &service.Attempt{Channel: "browser", Action: action}, Observation: accepted,
			Took: time.Millisecond})
	}
	o.Called(service.CallEvent{Attempt: &service.Attempt{Channel: "browser", Action: delivery.ActionQuery},
		Observation: delivery.Observation{Outcome: delivery.OutcomeQueryFound}, Took: time.Millisecond})
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

// TestAlertGaugesFollowTheBuckets: each reading of the fleet-wide gauges replaces the last one; a
// channel whose bucket is gone loses its pause series rather than showing a pause that ended.
func TestAlertGaugesFollowTheBuckets(t *testing.T) {
	is := is.New(t)
	m := newMetrics()
	at := time.Unix(1_800_000_000, 0)
	m.onAlertGauges(service.AlertGauges{Parked: 2, OldestParkedSeconds: 60, OldestDueSeconds: 5, LateAccepted: 1, Scheduled: 7,
		RateLimits: []service.Bucket{{Channel: "push", PausedFor: 30}, {Channel: "sms"}}}, at)
	m.onAlertGauges(service.AlertGauges{Parked: 1, OldestParkedSeconds: 90,
		RateLimits: []service.Bucket{{Channel: "push", PausedFor: 12}}}, at.Add(15*time.Second))
	is.Equal(fleetGauges(t, m), map[string]float64{
		"notifier_tasks_parked":                             1,
		"notifier_tasks_parked_oldest_age_seconds":          90,
		"notifier_tasks_due_oldest_age_seconds":             0, // none due any more
		"notifier_tasks_late_accepted":                      0,
		"notifier_tasks_scheduled":                          0,  // none scheduled any more
		"notifier_rate_limit_paused_seconds channel=push":   12, // sms's bucket is gone, and its series with it
		"notifier_fleet_gauges_refreshed_timestamp_seconds": 1_800_000_015,
	})
}

// fleetGauges are the fleet-wide gauges m exports now, by name and labels ("name label=value").
func fleetGauges(t *testing.T, m *metrics) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	families, err := m.registry.Gather()
	is.New(t).NoErr(err)
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			name := f.GetName()
			for _, l := range metric.GetLabel() {
				name += " " + l.GetName() + "=" + l.GetValue()
			}
			if g := metric.GetGauge(); g != nil && strings.HasPrefix(name, "notifier_") && !strings.HasPrefix(name, "notifier_database_") &&
				!strings.HasPrefix(name, "notifier_worker_") {
				got[name] = g.GetValue()
			}
		}
	}
	return got
}

// TestAccountPausedChannelMetric: a channel the worker's query paused for an account state (ChannelPauseRefused,
// as a finish writes it) shows in notifier_channel_account_paused_seconds, as seconds since the pause
// began by the database's clock, once the fleet-wide gauges are read; its series is gone once a probe
// ends the pause (ChannelPauseEnd), rather than showing a pause that ended.
func TestAccountPausedChannelMetric(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	_, pool := newCLI(t)
	q, n, m := dbgen.New(pool), service.NewNotifier(pool), newMetrics()
	read := func() map[string]float64 {
		g, err := n.AlertGauges(ctx)
		is.NoErr(err)
		m.onAlertGauges(g, time.Now())
		return fleetGauges(t, m)
	}
	const series = "notifier_channel_account_paused_seconds channel=sms"
	_, found := read()[series]
	is.True(!found) // no pause, no series

	row, err := q.ChannelPauseRefused(ctx, dbgen.ChannelPauseRefusedParams{Channel: "sms",
		Cause: "401 code 20003: Authenticate", StartSeconds: 2, HoldSeconds: 30, CapSeconds: 300})
	is.NoErr(err)
	is.True(row.Began) // the refusal paused sms
	_, err = pool.Exec(ctx, `UPDATE channel_pause SET paused_at = now() - interval '90 seconds'`)
	is.NoErr(err) // as if it began 90 s ago
	got := read()
	is.True(got[series] >= 90 && got[series] < 3600) // seconds since the pause began
	_, found = got["notifier_channel_account_paused_seconds channel=push"]
	is.True(!found) // a series for the paused channel only

	ended, err := q.ChannelPauseEnd(ctx, "sms")
	is.NoErr(err)
	is.Equal(len(ended), 1) // a probe ended the pause
	_, found = read()[series]
	is.True(!found) // and its series is gone
}
