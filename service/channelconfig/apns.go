package channelconfig

import (
	"fmt"

	"github.com/notifierhq/notifier/service/apns"
	"github.com/notifierhq/notifier/service/delivery"
)

// KindAPNs is Apple's Push Notification service with token authentication: no keys, no queries;
// resend_with_collapse gives a task's notifications its apns-collapse-id and resends under it, which
// replaces a copy the device has not yet received. Apple does not say that a 5xx or a 429 comes before
// acceptance: both are uncertain (docs/channels.md#apns).
const KindAPNs = "apns"

type apnsConfig struct {
	CAFile      string `toml:"ca_file"`
	AuthKeyEnv  string `toml:"auth_key_env"`
	AuthKeyFile string `toml:"auth_key_file"`
	KeyID       string `toml:"key_id"`
	TeamID      string `toml:"team_id"`
	Topic       string `toml:"topic"`
	PushType    string `toml:"push_type"`
	Environment string `toml:"environment"`
	Endpoint    string `toml:"endpoint"`
}

func init() {
	register(kind{
		name:         KindAPNs,
		modes:        []delivery.Mode{delivery.ModeNone},
		offers:       "offers neither idempotency keys nor queries: want none (see resend_with_collapse)",
		contractKeys: []string{"resend_with_collapse"},
		defaults:     delivery.Contract{ServerErrorsUncertain: true},
	}, func(l loader, c *apnsConfig) (delivery.Channel, error) {
		pem, err := l.secret("auth_key", c.AuthKeyEnv, c.AuthKeyFile)
		if err != nil {
			return nil, err
		}
		key, err := apns.ParseKey([]byte(pem))
		if err != nil {
			return nil, keyErr("auth_key", err)
		}
		endpoint := c.Endpoint
		switch c.Environment {
		case "", "production":
			if endpoint == "" {
				endpoint = apns.ProductionEndpoint
			}
		case "sandbox":
			if endpoint == "" {
				endpoint = apns.SandboxEndpoint
			}
		default:
			return nil, fmt.Errorf("environment %q: want production or sandbox", c.Environment)
		}
		client, err := apns.New(apns.Options{Key: key, KeyID: c.KeyID, TeamID: c.TeamID, Topic: c.Topic,
			PushType: c.PushType, Endpoint: endpoint, CAFile: l.path(c.CAFile), Collapse: l.channelContract.ResendWithTopic})
		return client, keyErr("apns", err)
	})
}
