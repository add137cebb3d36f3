package channelconfig_test

import (
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

const postmarkToken = "pm-config-test-9z8y7x"

func loadPostmark(t *testing.T, extra string) (map[string]delivery.Route, error) {
	t.Helper()
	path := writeDir(t, map[string]string{"channels.toml": "[channels.email]\nkind = \"postmark\"\nserver_token_env = \"POSTMARK_SERVER_TOKEN\"\nfrom = \"noreply@example.com\"\n" + extra})
	return channelconfig.Load(path, env(map[string]string{"POSTMARK_SERVER_TOKEN": postmarkToken}))
}

// Kind postmark is queryable by default with Postmark's contract: a settle time for the lagging
// search, at most 45 days in flight, 5xx uncertain.
func TestPostmarkKindDefaults(t *testing.T) {
	is := is.New(t)
	routes, err := loadPostmark(t, "")
	is.NoErr(err)
	r := routes["email"]
	is.Equal(r.Mode, delivery.ModeQueryable)                            // the default mode
	is.Equal(r.Contract.QuerySettle, channelconfig.PostmarkQuerySettle) // the search lags
	is.Equal(r.Contract.MaxInFlightAge, 45*24*time.Hour)                // the search keeps 45 days
	is.True(r.Contract.ServerErrorsUncertain)                           // a 500 may follow acceptance
	routes, err = loadPostmark(t, "query_settle = \"1m\"\nmax_in_flight_age = \"24h\"\n")
	is.NoErr(err)
	is.Equal(routes["email"].Contract.QuerySettle, time.Minute)
	is.Equal(routes["email"].Contract.MaxInFlightAge, 24*time.Hour)
}

func TestPostmarkKindRefusals(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{"mode = \"idempotent\"\n", "mode"},
		{"idempotency_window = \"1h\"\n", "idempotency_window"},
		{"max_in_flight_age = \"2000h\"\n", "max_in_flight_age"},
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
