package channelconfig_test

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

const sesSecret = "ses_config_test_secret_4d3c"

const sesTable = "[channels.email]\nkind = \"ses\"\nregion = \"eu-west-1\"\nfrom = \"noreply@example.com\"\n" +
	"configuration_set = \"notifier-events\"\n" +
	"access_key_id_env = \"AWS_ACCESS_KEY_ID\"\nsecret_access_key_env = \"AWS_SECRET_ACCESS_KEY\"\n"

func loadSES(t *testing.T, table string) (map[string]delivery.Route, error) {
	t.Helper()
	path := writeDir(t, map[string]string{"channels.toml": table})
	return channelconfig.Load(path, env(map[string]string{"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": sesSecret}))
}

func TestSESKindDefaults(t *testing.T) {
	is := is.New(t)
	routes, err := loadSES(t, sesTable+"server_errors_uncertain = false\n")
	is.NoErr(err)
	is.Equal(routes["email"].Mode, delivery.ModeNone)       // the only mode
	is.True(routes["email"].Contract.ServerErrorsUncertain) // SES's 5xx may follow acceptance
	is.True(routes["email"].Contract.ThrottleRefuses)       // its throttling errors do not
	noKeys := strings.Replace(strings.Replace(sesTable, "access_key_id_env = \"AWS_ACCESS_KEY_ID\"\n", "", 1),
		"secret_access_key_env = \"AWS_SECRET_ACCESS_KEY\"\n", "", 1)
	_, err = loadSES(t, noKeys)
	is.NoErr(err) // neither key: the SDK's default credential chain
}

func TestSESKindRefusals(t *testing.T) {
	for _, tc := range []struct{ table, want string }{
		{sesTable + "mode = \"idempotent\"\n", "mode"},
		{sesTable + "mode = \"queryable\"\n", "mode"},
		{sesTable + "resend_with_collapse = true\n", "resend_with_collapse"},
		{sesTable + "secret_access_key = \"" + sesSecret + "\"\n", "secret_access_key"},
		{sesTable + "endpoint = \"http://email.eu-west-1.amazonaws.com\"\n", "endpoint"},
		{strings.Replace(sesTable, "access_key_id_env = \"AWS_ACCESS_KEY_ID\"\n", "", 1), "access_key_id_env"},
		{strings.Replace(sesTable, "region = \"eu-west-1\"\n", "", 1), "region"},
		{strings.Replace(sesTable, "from = \"noreply@example.com\"\n", "", 1), "from"},
		{strings.Replace(sesTable, "configuration_set = \"notifier-events\"\n", "", 1), "configuration_set"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			is := is.New(t)
			_, err := loadSES(t, tc.table)
			is.True(err != nil)                             // refused
			is.True(strings.Contains(err.Error(), tc.want)) // naming the key
			is.True(!strings.Contains(err.Error(), sesSecret))
			t.Log(err)
		})
	}
}
