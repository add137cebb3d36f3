package channelconfig_test

import (
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/postmark"
)

const postmarkToken = "pm-config-test-9z8y7x"

func loadPostmark(t *testing.T, extra string) (map[string]delivery.Route, error) {
	t.Helper()
	path := writeDir(t, map[string]string{"channels.toml": "[channels.email]\nkind = \"postmark\"\nserver_token_env = \"POSTMARK_SERVER_TOKEN\"\nfrom = \"noreply@example.com\"\n" + extra})
	return channelconfig.Load(path, env(map[string]string{"POSTMARK_SERVER_TOKEN": postmarkToken}))
}

// Kind postmark is queryable by default with Postmark's contract: a settle time for the lagging
// search, in flight no longer than the shortest retention any account can have allows, 5xx and 429
// uncertain.
func TestPostmarkKindDefaults(t *testing.T) {
	is := is.New(t)
	routes, err := loadPostmark(t, "")
	is.NoErr(err)
	r := routes["email"]
	is.Equal(r.Mode, delivery.ModeQueryable)                            // the default mode
	is.Equal(r.Contract.QuerySettle, channelconfig.PostmarkQuerySettle) // the search lags
	is.Equal(r.Contract.MaxInFlightAge, postmark.MaxInFlightAge(7*24*time.Hour, channelconfig.PostmarkQuerySettle))
	is.True(r.Contract.MaxInFlightAge < 6*24*time.Hour) // inside 7 days' retention, with margins
	is.True(r.Contract.ServerErrorsUncertain)           // a 500 may follow acceptance
	is.True(!r.Contract.ThrottleRefuses)                // Postmark does not say a 429 sent nothing
	routes, err = loadPostmark(t, "query_settle = \"1m\"\nmax_in_flight_age = \"24h\"\n")
	is.NoErr(err)
	is.Equal(routes["email"].Contract.QuerySettle, time.Minute)
	is.Equal(routes["email"].Contract.MaxInFlightAge, 24*time.Hour)
	routes, err = loadPostmark(t, "retention = \"45d\"\n")
	is.NoErr(err)
	is.Equal(routes["email"].Contract.MaxInFlightAge, 45*24*time.Hour-24*time.Hour-channelconfig.PostmarkQuerySettle-postmark.QueryReachAllowance)
	routes, err = loadPostmark(t, "retention = \"45d\"\nmax_in_flight_age = \"1000h\"\n")
	is.NoErr(err) // 41.7 days: below 45 days less the margins
	is.Equal(routes["email"].Contract.MaxInFlightAge, 1000*time.Hour)
}

func TestPostmarkKindRefusals(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{"mode = \"idempotent\"\n", "mode"},
		{"idempotency_window = \"1h\"\n", "idempotency_window"},
		{"max_in_flight_age = \"2000h\"\n", "max_in_flight_age"},
		{"max_in_flight_age = \"7d\"\n", "max_in_flight_age"},
		{"max_in_flight_age = \"144h\"\n", "max_in_flight_age"}, // 6 days: too close to the default 7 days' retention
		{"retention = \"45d\"\nmax_in_flight_age = \"1070h\"\n", "max_in_flight_age"},
		{"retention = \"6d\"\n", "retention"},
		{"retention = \"366d\"\n", "retention"},
		{"retention = \"45\"\n", "retention"},
		{"retention = \"1080h\"\n", "retention"},
		{"retention = \"7d\"\nquery_settle = \"150h\"\n", "query_settle"},
		{"server_token = \"" + postmarkToken + "\"\n", "server_token"},
		{"base_url = \"http://api.postmarkapp.com\"\n", "base_url"},
		{"api_key_env = \"X\"\n", "api_key_env"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			is := is.New(t)
			_, err := loadPostmark(t, tc.extra)
			is.True(err != nil)                             // refused
			is.True(strings.Contains(err.Error(), tc.want)) // naming the key
			is.True(!strings.Contains(err.Error(), postmarkToken))
			t.Log(err)
		})
	}
}
