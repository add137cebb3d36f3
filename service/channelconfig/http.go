package channelconfig

import (
	"errors"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// KindHTTP is an endpoint speaking notifier's own HTTP channel protocol (docs/channels.md): it
// declares which of the three modes it supports, so the table must say.
const KindHTTP = "http"

type httpConfig struct {
	URL       string `toml:"url"`
	CAFile    string `toml:"ca_file"`
	TokenEnv  string `toml:"token_env"`  // optional: sent as "Authorization: Bearer <token>"
	TokenFile string `toml:"token_file"` // (401/403 then pause the channel: docs/channels.md#account-states)
}

func init() {
	register(kind{
		name:         KindHTTP,
		modes:        []delivery.Mode{delivery.ModeIdempotent, delivery.ModeQueryable, delivery.ModeNone},
		modeRequired: true,
		offers:       "idempotent, queryable or none: what the endpoint promises",
		contractKeys: []string{"idempotency_window", "query_settle"},
	}, func(l loader, c *httpConfig) (delivery.Channel, error) {
		if c.URL == "" {
			return nil, errors.New("url: required for kind http")
		}
		var token string
		if c.TokenEnv != "" || c.TokenFile != "" {
			var err error
			if token, err = l.secret("token", c.TokenEnv, c.TokenFile); err != nil {
				return nil, err
			}
		}
		client, err := httpchannel.New(c.URL, httpchannel.Options{CAFile: l.path(c.CAFile), Token: token})
		return client, keyErr("url", err)
	})
}
