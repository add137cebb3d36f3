package channelconfig_test

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

const twilioToken = "tw_config_test_7f3e2d"

const twilioTable = "[channels.sms]\nkind = \"twilio\"\naccount_sid = \"AC0123456789abcdef0123456789abcdef\"\n" +
	"auth_token_env = \"TWILIO_AUTH_TOKEN\"\nfrom = \"+15017122661\"\nstatus_callback_url = \"https://notifier.example.com/receipts/twilio\"\n"

func loadTwilio(t *testing.T, table string) (map[string]delivery.Route, error) {
	t.Helper()
	path := writeDir(t, map[string]string{"channels.toml": table})
	return channelconfig.Load(path, env(map[string]string{"TWILIO_AUTH_TOKEN": twilioToken}))
}

// Kind twilio is mode none with 5xx uncertain, whatever the file says.
func TestTwilioKindDefaults(t *testing.T) {
	is := is.New(t)
	routes, err := loadTwilio(t, twilioTable+"server_errors_uncertain = false\n")
	is.NoErr(err)
	r := routes["sms"]
	is.Equal(r.Mode, delivery.ModeNone)       // the only mode
	is.True(r.Contract.ServerErrorsUncertain) // Twilio's 5xx may follow acceptance
	is.True(r.Contract.ThrottleRefuses)       // its 429 does not
}

// A file that claims more than Twilio offers, or misses what it needs, is refused naming the key; the
// token never appears in an error.
func TestTwilioKindRefusals(t *testing.T) {
	for _, tc := range []struct{ table, want string }{
		{twilioTable + "mode = \"queryable\"\n", "mode"},
		{twilioTable + "mode = \"idempotent\"\n", "mode"},
		{twilioTable + "query_settle = \"30s\"\n", "query_settle"},
		{twilioTable + "resend_with_topic = true\n", "resend_with_topic"},
		{twilioTable + "auth_token = \"" + twilioToken + "\"\n", "auth_token"},
		{twilioTable + "messaging_service_sid = \"MG1\"\n", "messaging_service_sid"},
		{twilioTable + "base_url = \"http://api.twilio.com\"\n", "base URL"},
		{strings.Replace(twilioTable, "status_callback_url", "x_status_callback_url", 1), "status_callback_url"},
		{strings.Replace(twilioTable, "account_sid = \"AC0123456789abcdef0123456789abcdef\"\n", "", 1), "account_sid"},
		{strings.Replace(twilioTable, "auth_token_env = \"TWILIO_AUTH_TOKEN\"\n", "", 1), "auth_token"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			is := is.New(t)
			_, err := loadTwilio(t, tc.table)
			is.True(err != nil)                             // refused
			is.True(strings.Contains(err.Error(), tc.want)) // naming the key
			is.True(!strings.Contains(err.Error(), twilioToken))
			t.Log(err)
		})
	}
}
