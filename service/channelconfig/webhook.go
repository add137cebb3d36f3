package channelconfig

import (
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/webhook"
)

// KindWebhook is a Standard Webhooks receiver: deduplicated by webhook-id, never queried.
const KindWebhook = "webhook"

type webhookConfig struct {
	CAFile     string `toml:"ca_file"`
	SecretEnv  string `toml:"secret_env"`
	SecretFile string `toml:"secret_file"`
	// AllowedNetworks opts in networks the egress policy refuses (a receiver on a private network).
	AllowedNetworks []string `toml:"allowed_networks"`
}

func init() {
	register(kind{
		name:         KindWebhook,
		modes:        []delivery.Mode{delivery.ModeIdempotent, delivery.ModeNone},
		offers:       "offers no query (Standard Webhooks are idempotent by webhook-id): want idempotent or none",
		contractKeys: []string{"idempotency_window"},
	}, func(l loader, c *webhookConfig) (delivery.Channel, error) {
		secret, err := l.secret("secret", c.SecretEnv, c.SecretFile)
		if err != nil {
			return nil, err
		}
		allowed, err := allowedNetworks(c.AllowedNetworks)
		if err != nil {
			return nil, err
		}
		client, err := webhook.New(secret, webhook.Options{CAFile: l.path(c.CAFile), AllowedNetworks: allowed})
		return client, keyErr("secret", err)
	})
}
