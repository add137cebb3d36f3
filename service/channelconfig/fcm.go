package channelconfig

import (
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/fcm"
)

// KindFCM is Firebase Cloud Messaging's HTTP v1 API: no keys, no queries; resend_with_collapse gives a
// task's messages its collapse key and resends under it, which replaces a copy the device has not yet
// received (at the price of FCM's four collapse keys per device, docs/channels.md#fcm). FCM does not
// say that a 5xx comes before acceptance (uncertain), and says that a 429 was rejected (a refusal).
const KindFCM = "fcm"

type fcmConfig struct {
	CAFile             string `toml:"ca_file"`
	ServiceAccountEnv  string `toml:"service_account_env"`
	ServiceAccountFile string `toml:"service_account_file"`
	ProjectID          string `toml:"project_id"`
	Endpoint           string `toml:"endpoint"`
	TokenURL           string `toml:"token_url"`
}

func init() {
	register(kind{
		name:         KindFCM,
		modes:        []delivery.Mode{delivery.ModeNone},
		offers:       "offers neither idempotency keys nor queries: want none (see resend_with_collapse)",
		contractKeys: []string{"resend_with_collapse"},
		defaults:     delivery.Contract{ServerErrorsUncertain: true, ThrottleRefuses: true},
	}, func(l loader, c *fcmConfig) (delivery.Channel, error) {
		key, err := l.secret("service_account", c.ServiceAccountEnv, c.ServiceAccountFile)
		if err != nil {
			return nil, err
		}
		sa, err := fcm.ParseServiceAccount([]byte(key))
		if err != nil {
			return nil, keyErr("service_account", err)
		}
		client, err := fcm.New(fcm.Options{Account: sa, ProjectID: c.ProjectID, Endpoint: c.Endpoint,
			TokenURL: c.TokenURL, CAFile: l.path(c.CAFile), Collapse: l.channelContract.ResendWithTopic})
		return client, keyErr("fcm", err)
	})
}
