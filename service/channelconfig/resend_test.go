package channelconfig_test

import (
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/resend"
)

const resendKey = "re_config_test_1a2b3c"

func loadResend(t *testing.T, extra string) (map[string]delivery.Route, error) {
	t.Helper()
	path := writeDir(t, map[string]string{"channels.toml": "[channels.email]\nkind = \"resend\"\napi_key_env = \"RESEND_API_KEY\"\nfrom = \"noreply@example.com\"\n" + extra})
	return channelconfig.Load(path, env(map[string]string{"RESEND_API_KEY": resendKey}))
}

// Kind resend is idempotent by default with Resend's documented contract: keys kept 24 hours, of which
// a resend may use all but the time it takes to reach Resend and the clocks' skew; 5xx uncertain (even
// when the file says otherwise).
func TestResendKindDefaults(t *testing.T) {
	is := is.New(t)
	routes, err := loadResend(t, "server_errors_uncertain = false\n")
	is.NoErr(err)
	r := routes["email"]
	is.Equal(r.Mode, delivery.ModeIdempotent)                        // the default mode
	is.Equal(r.Contract.IdempotencyWindow, resend.IdempotencyWindow) // Resend's 24 hours less the margin
	is.True(!r.Contract.ThrottleRefuses)                             // Resend does not say a 429 sent nothing
	is.True(r.Contract.ServerErrorsUncertain)                        // Resend's 5xx may follow acceptance
	routes, err = loadResend(t, "idempotency_window = \"1h\"\n")
	is.NoErr(err)
	is.Equal(routes["email"].Contract.IdempotencyWindow, time.Hour) // a shorter window is allowed
	routes, err = loadResend(t, "mode = \"none\"\n")
	is.NoErr(err)
	is.Equal(routes["email"].Mode, delivery.ModeNone) // claiming less is allowed
}

// A file that claims more than Resend offers is refused with an error naming the key; the API key
// never appears in an error.
func TestResendKindRefusals(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{"mode = \"queryable\"\n", "mode"},
		{"idempotency_window = \"48h\"\n", "idempotency_window"},
		{"idempotency_window = \"24h\"\n", "idempotency_window"}, // no margin left: a resend could outlive the key
		{"query_settle = \"30s\"\n", "query_settle"},
		{"api_key = \"" + resendKey + "\"\n", "api_key"},
		{"base_url = \"http://api.resend.com\"\n", "base_url"},
		{"url = \"https://x.example\"\n", "url"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			is := is.New(t)
			_, err := loadResend(t, tc.extra)
			is.True(err != nil)                             // refused
			is.True(strings.Contains(err.Error(), tc.want)) // naming the key
			is.True(!strings.Contains(err.Error(), resendKey))
			t.Log(err)
		})
	}
	is := is.New(t)
	path := writeDir(t, map[string]string{"channels.toml": "[channels.email]\nkind = \"resend\"\napi_key_env = \"RESEND_API_KEY\"\n"})
	_, err := channelconfig.Load(path, env(map[string]string{"RESEND_API_KEY": resendKey}))
	is.True(err != nil && strings.Contains(err.Error(), "from")) // a sender is required
	path = writeDir(t, map[string]string{"channels.toml": "[channels.email]\nkind = \"resend\"\nfrom = \"noreply@example.com\"\n"})
	_, err = channelconfig.Load(path, env(nil))
	is.True(err != nil && strings.Contains(err.Error(), "api_key_env or api_key_file")) // a key is required
}

// The window's boundary, as Decide applies the kind's contract: a resend claimed at the window's last
// moment is sent, and reaches Resend before the key's 24 hours end even at the end of its call's reach
// and with the clocks apart by the skew allowance; one claimed at the window's end is parked.
func TestResendKindWindowEndsBeforeTheKey(t *testing.T) {
	is := is.New(t)
	routes, err := loadResend(t, "")
	is.NoErr(err)
	r := routes["email"]
	facts := delivery.ClaimFacts{Uncertain: true, PrefEnabled: true, AttemptCount: 1, MaxAttempts: 5, Mode: r.Mode, Contract: r.Contract}
	last := r.Contract.IdempotencyWindow - time.Nanosecond
	facts.UncertainAge = last
	d := delivery.Decide(facts)
	is.Equal(d.Kind, delivery.ClaimCall)                                                   // the last allowed moment: resent with the key
	is.Equal(d.Action, delivery.ActionSend)                                                //
	is.True(last+resend.CallReachAllowance+resend.ClockSkewAllowance < resend.KeyLifetime) // and it arrives in time
	facts.UncertainAge = r.Contract.IdempotencyWindow
	is.Equal(delivery.Decide(facts).Kind, delivery.ClaimPark) // later: parked, never resent
}
