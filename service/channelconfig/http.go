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
	URL    string `toml:"url"`
	CAFile string `toml:"ca_file"`
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
		client, err := httpchannel.New(c.URL, httpchannel.Options{CAFile: l.path(c.CAFile)})
		return client, keyErr("url", err)
	})
}
