package channelconfig

import (
	"errors"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/webpush"
)

// KindWebPush is RFC 8030 Web Push with VAPID: no keys, no queries; resend_with_topic replaces a copy
// the device has not yet received.
const KindWebPush = "webpush"

type webpushConfig struct {
	CAFile              string `toml:"ca_file"`
	VAPIDPrivateKeyEnv  string `toml:"vapid_private_key_env"`
	VAPIDPrivateKeyFile string `toml:"vapid_private_key_file"`
	VAPIDSubject        string `toml:"vapid_subject"`
	Urgency             string `toml:"urgency"`
	// AllowedNetworks opts in networks the egress policy refuses (a push service on a private network).
	AllowedNetworks []string `toml:"allowed_networks"`
}

func init() {
	register(kind{
		name:         KindWebPush,
		modes:        []delivery.Mode{delivery.ModeNone},
		offers:       "offers neither idempotency keys nor queries: want none (see resend_with_topic)",
		contractKeys: []string{"resend_with_topic"},
	}, func(l loader, c *webpushConfig) (delivery.Channel, error) {
		pem, err := l.secret("vapid_private_key", c.VAPIDPrivateKeyEnv, c.VAPIDPrivateKeyFile)
		if err != nil {
			return nil, err
		}
		key, err := webpush.ParseVAPIDKey([]byte(pem))
		if err != nil {
			return nil, keyErr("vapid_private_key", err)
		}
		if c.VAPIDSubject == "" {
			return nil, errors.New("vapid_subject: required (mailto:address or an https URL the push service can use to reach you)")
		}
		allowed, err := allowedNetworks(c.AllowedNetworks)
		if err != nil {
			return nil, err
		}
		client, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: c.VAPIDSubject,
			Urgency: webpush.Urgency(c.Urgency), CAFile: l.path(c.CAFile), AllowedNetworks: allowed})
		return client, keyErr("webpush", err)
	})
}
