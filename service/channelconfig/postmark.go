package channelconfig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/postmark"
)

// KindPostmark is email through Postmark's API (service/postmark): no idempotency key, but the
// outbound message search finds an email by the ref in its metadata, for the account's retention, with
// a lag.
const KindPostmark = "postmark"

// PostmarkQuerySettle is how long after an uncertain attempt began a "not found" from Postmark's search
// is not trusted. Postmark publishes no bound on how far its search lags behind acceptance, so this is
// an assumption: if the lag is ever longer, a "not found" after it leads to a resend and the user gets a
// second email. Fifteen minutes is far beyond the seconds the search is seen to lag, and costs little:
// only a task whose answer was lost waits it, before its query is trusted. query_settle overrides it.
const PostmarkQuerySettle = 15 * time.Minute

type postmarkConfig struct {
	ServerTokenEnv  string `toml:"server_token_env"`
	ServerTokenFile string `toml:"server_token_file"`
	From            string `toml:"from"`
	SubjectPrefix   string `toml:"subject_prefix"`
	MessageStream   string `toml:"message_stream"`
	BaseURL         string `toml:"base_url"`
	CAFile          string `toml:"ca_file"`
	// Retention is the account's message retention ("45d"; Postmark's Retention Add-on: 7d to 365d). It
	// bounds max_in_flight_age: after it, the search no longer finds an email it accepted.
	Retention string `toml:"retention"`
}

func init() {
	register(kind{
		name:         KindPostmark,
		modes:        []delivery.Mode{delivery.ModeQueryable, delivery.ModeNone},
		offers:       "offers a search by metadata (for the account's retention) but no idempotency key: want queryable or none",
		contractKeys: []string{"query_settle"},
		// Postmark's search lags; it keeps messages for the account's retention (postmarkContract bounds
		// max_in_flight_age by it); neither its 500 nor its 429 is documented to come before acceptance:
		// no ThrottleRefuses (docs/channels.md#postmark).
		defaults: delivery.Contract{QuerySettle: PostmarkQuerySettle, ServerErrorsUncertain: true},
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
	}, postmarkContract)
}

// postmarkContract bounds max_in_flight_age by the account's retention (retention, by default the
// shortest any account can have) less query_settle and postmark.MaxInFlightAge's margins, and fills it in
// when the table leaves it unset.
func postmarkContract(c *postmarkConfig, mode delivery.Mode, k delivery.Contract) (delivery.Contract, error) {
	retention, err := parseRetention(c.Retention)
	if err != nil {
		return k, err
	}
	if mode != delivery.ModeQueryable {
		return k, nil // never queried: the retention bounds nothing
	}
	limit := postmark.MaxInFlightAge(retention, k.QuerySettle)
	if limit <= 0 {
		return k, fmt.Errorf("query_settle %s: leaves no time to query within retention %s", k.QuerySettle, days(retention))
	}
	if k.MaxInFlightAge == 0 {
		k.MaxInFlightAge = limit
	}
	if k.MaxInFlightAge > limit {
		return k, fmt.Errorf("max_in_flight_age %s: must stay below retention %s less query_settle %s, a day for the expiry's date and %s for a query's reach: at most %s",
			k.MaxInFlightAge, days(retention), k.QuerySettle, postmark.QueryReachAllowance, limit)
	}
	return k, nil
}

// parseRetention reads retention: whole days ("45d") from Postmark's 7 to 365; "" is the default.
func parseRetention(s string) (time.Duration, error) {
	if s == "" {
		return postmark.DefaultRetention, nil
	}
	n, err := strconv.Atoi(strings.TrimSuffix(s, "d"))
	d := time.Duration(n) * 24 * time.Hour
	if !strings.HasSuffix(s, "d") || err != nil || d < postmark.MinRetention || d > postmark.MaxRetention {
		return 0, fmt.Errorf("retention %q: want the account's retention in whole days, %s to %s (Postmark's range), such as \"45d\"",
			s, days(postmark.MinRetention), days(postmark.MaxRetention))
	}
	return d, nil
}

func days(d time.Duration) string { return strconv.Itoa(int(d/(24*time.Hour))) + "d" }
