package channelconfig

import (
	"errors"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/postmark"
)

// KindPostmark is email through Postmark's API (service/postmark): no idempotency key, but the
// outbound message search finds an email by the ref in its metadata, for 45 days, with a lag.
const KindPostmark = "postmark"

// PostmarkQuerySettle is how long after an uncertain attempt a "not found" from Postmark's search is
// not trusted. Postmark documents no figure for how far its search lags behind acceptance; five
// minutes is our margin, and query_settle overrides it.
const PostmarkQuerySettle = 5 * time.Minute

type postmarkConfig struct {
	ServerTokenEnv  string `toml:"server_token_env"`
	ServerTokenFile string `toml:"server_token_file"`
	From            string `toml:"from"`
	SubjectPrefix   string `toml:"subject_prefix"`
	MessageStream   string `toml:"message_stream"`
	BaseURL         string `toml:"base_url"`
	CAFile          string `toml:"ca_file"`
}

func init() {
	register(kind{
		name:         KindPostmark,
		modes:        []delivery.Mode{delivery.ModeQueryable, delivery.ModeNone},
		offers:       "offers a search by metadata (45 days) but no idempotency key: want queryable or none",
		contractKeys: []string{"query_settle"},
		// Postmark's search lags and keeps 45 days; its 500 may come after acceptance.
		defaults: delivery.Contract{QuerySettle: PostmarkQuerySettle, MaxInFlightAge: postmark.Retention,
			ServerErrorsUncertain: true},
	}, func(l loader, c *postmarkConfig) (delivery.Channel, error) {
		token, err := l.secret("server_token", c.ServerTokenEnv, c.ServerTokenFile)
		if err != nil {
			return nil, err
		}
		if c.From == "" {
			return nil, errors.New("from: required (a confirmed sender signature at Postmark)")
		}
		client, err := postmark.New(postmark.Options{ServerToken: token, From: c.From, SubjectPrefix: c.SubjectPrefix,
			MessageStream: c.MessageStream, BaseURL: c.BaseURL, CAFile: l.path(c.CAFile)})
		if err != nil {
			return nil, keyErr("", redactKey(err, token))
		}
		return client, nil
	})
}
