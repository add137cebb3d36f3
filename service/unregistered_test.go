package service_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// A provider's "this address is gone for good" (FCM UNREGISTERED, APNs 410) switches the user's
// preference off when the worker is asked to (work --disable-on-unregistered), so the next
// notification is suppressed instead of sent to a dead address. Without the option, or for any answer
// that is not a recorded rejection, the preference stays as it was.
func TestUnregisteredAddressDisablesThePreference(t *testing.T) {
	gone := delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true, Detail: "UNREGISTERED"}
	cases := []struct {
		name    string
		disable bool
		obs     delivery.Observation
		result  service.ResultKind
		off     bool
	}{
		{"asked to: the preference goes off", true, gone, service.ResultFailed, true},
		{"not asked to: it stays on", false, gone, service.ResultFailed, false},
		{"a plain rejection: it stays on", true, delivery.Observation{Outcome: delivery.OutcomeRejected}, service.ResultFailed, false},
		// Unregistered only means something on a rejection: an uncertain answer leaves the address alone.
		{"unregistered on a timeout: it stays on", true, delivery.Observation{Outcome: delivery.OutcomeTimeout, Unregistered: true}, service.ResultUnknown, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "push")
			e.create("u1", "first", time.Hour, 3)
			d := e.dispatcher(dcfg{configure: func(cfg *service.DispatcherConfig) { cfg.DisableUnregistered = c.disable }})
			a, _, err := claimOne(e.ctx, d)
			is.NoErr(err)
			is.True(a != nil)
			res, err := finishOne(e.ctx, d, a, c.obs)
			is.NoErr(err)
			is.Equal(res.Kind, c.result)
			is.Equal(res.PrefDisabled, c.off)

			var enabled bool
			is.NoErr(e.pool.QueryRow(e.ctx, "SELECT enabled FROM channel_pref WHERE user_id = 'u1' AND channel = 'push'").Scan(&enabled))
			is.Equal(enabled, !c.off)

			// The next notification to that user on that channel: no task when the preference is off.
			_, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "second", Body: "body", TTL: time.Hour, MaxAttempts: 3})
			is.NoErr(err)
			is.True(created)
			is.Equal(len(tasks) == 0, c.off)
		})
	}
}
