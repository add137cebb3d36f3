package channelconfig_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
	"github.com/notifierhq/notifier/service/smtpchannel"
	"github.com/notifierhq/notifier/service/webhook"
	"github.com/notifierhq/notifier/service/webpush"
)

const webhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // 24 bytes, the spec's example form

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// writeDir writes files into a fresh directory and returns the path of the first one named
// channels.toml.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "channels.toml")
}

func vapidPEM(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

func TestConfigValid(t *testing.T) {
	is := is.New(t)
	path := writeDir(t, map[string]string{
		"channels.toml": `
[channels.push]
kind = "http"
mode = "idempotent"
url = "https://push.internal.example"
idempotency_window = "24h"
max_in_flight_age = "1h"

[channels.sms]
kind = "http"
mode = "queryable"
url = "https://sms.internal.example/v1"
query_settle = "30s"
server_errors_uncertain = true

[channels.email]
kind = "smtp"
addr = "smtp.example:587"
starttls = "required"
username = "notifier"
password_env = "SMTP_PASSWORD"
from = "Notifier <noreply@example.com>"
message_id_domain = "notify.example.com"
subject_prefix = "[Shop] "

[channels.hooks]
kind = "webhook"
secret_file = "webhook-secret"   # relative to this file

[channels.browser]
kind = "webpush"
vapid_private_key_file = "vapid.pem"
vapid_subject = "mailto:ops@example.com"
urgency = "high"
resend_with_topic = true
`,
		"webhook-secret": webhookSecret + "\n",
		"vapid.pem":      vapidPEM(t),
	})
	routes, err := channelconfig.Load(path, env(map[string]string{"SMTP_PASSWORD": "pw"}))
	is.NoErr(err)            // valid
	is.Equal(len(routes), 5) // every channel

	push := routes["push"]
	is.Equal(push.Mode, delivery.ModeIdempotent)                                                             // push mode
	is.Equal(push.Contract, delivery.Contract{IdempotencyWindow: 24 * time.Hour, MaxInFlightAge: time.Hour}) // push contract
	_, ok := push.Client.(*httpchannel.Client)
	is.True(ok) // push is the generic HTTP protocol

	sms := routes["sms"]
	is.Equal(sms.Mode, delivery.ModeQueryable)                                                            // sms mode
	is.Equal(sms.Contract, delivery.Contract{QuerySettle: 30 * time.Second, ServerErrorsUncertain: true}) // sms contract

	email := routes["email"]
	is.Equal(email.Mode, delivery.ModeNone) // smtp is NONE
	c, ok := email.Client.(*smtpchannel.Client)
	is.True(ok)                                                            // smtp client
	is.Equal(c.MessageID("ntf-task-1"), "<ntf-task-1@notify.example.com>") // configured domain

	hooks := routes["hooks"]
	is.Equal(hooks.Mode, delivery.ModeIdempotent) // webhook defaults to IDEMPOTENT
	_, ok = hooks.Client.(*webhook.Client)
	is.True(ok) // webhook client

	browser := routes["browser"]
	is.Equal(browser.Mode, delivery.ModeNone)                            // webpush is NONE
	is.Equal(browser.Contract, delivery.Contract{ResendWithTopic: true}) // with topic resend
	_, ok = browser.Client.(*webpush.Client)
	is.True(ok) // webpush client
}

// rate_limit is "N/s", "N/min" or "N/h", on any kind; burst defaults to one second's worth, at least one.
func TestConfigRateLimit(t *testing.T) {
	is := is.New(t)
	path := writeDir(t, map[string]string{"channels.toml": `
[channels.push]
kind = "http"
mode = "idempotent"
url = "https://push.internal.example"
rate_limit = "50/s"

[channels.sms]
kind = "http"
mode = "queryable"
url = "https://sms.internal.example"
rate_limit = "120/min"
burst = 10

[channels.slow]
kind = "http"
mode = "none"
url = "https://slow.internal.example"
rate_limit = "36/h"

[channels.hooks]
kind = "webhook"
secret_env = "S"
rate_limit = "0.5/s"
burst = 3

[channels.free]
kind = "http"
mode = "none"
url = "https://free.internal.example"

[channels.one]
kind = "http"
mode = "none"
url = "https://one.internal.example"
rate_limit = "5/s"
burst = 1

[channels.most]
kind = "http"
mode = "none"
url = "https://most.internal.example"
rate_limit = "1000000/s"
burst = 1000000
`})
	routes, err := channelconfig.Load(path, env(map[string]string{"S": webhookSecret}))
	is.NoErr(err)                                                                                                // valid
	is.Equal(routes["push"].RateLimit, delivery.RateLimit{PerSecond: 50, Burst: 50})                             // one second's worth
	is.Equal(routes["sms"].RateLimit, delivery.RateLimit{PerSecond: 2, Burst: 10})                               // per minute, with a burst
	is.Equal(routes["slow"].RateLimit, delivery.RateLimit{PerSecond: 0.01, Burst: 1})                            // per hour: at least one at once
	is.Equal(routes["hooks"].RateLimit, delivery.RateLimit{PerSecond: 0.5, Burst: 3})                            // any kind
	is.Equal(routes["free"].RateLimit, delivery.RateLimit{})                                                     // none
	is.Equal(routes["one"].RateLimit, delivery.RateLimit{PerSecond: 5, Burst: 1})                                // the smallest burst
	is.Equal(routes["most"].RateLimit, delivery.RateLimit{PerSecond: delivery.MaxRate, Burst: delivery.MaxRate}) // the largest
}

func TestConfigSecretsFromEnv(t *testing.T) {
	is := is.New(t)
	key := vapidPEM(t)
	path := writeDir(t, map[string]string{"channels.toml": `
[channels.hooks]
kind = "webhook"
mode = "none"
secret_env = "HOOK_SECRET"
[channels.browser]
kind = "webpush"
vapid_private_key_env = "VAPID_KEY"
vapid_subject = "https://example.com/contact"
`})
	routes, err := channelconfig.Load(path, env(map[string]string{"HOOK_SECRET": webhookSecret, "VAPID_KEY": key}))
	is.NoErr(err)                                     // valid
	is.Equal(routes["hooks"].Mode, delivery.ModeNone) // a webhook may claim less than it offers
}

// The http kind's token_env (or token_file) is sent as a bearer token on every request, so that the
// endpoint's 401/403 means our credential was refused (ACCOUNT_REFUSED: the channel pauses).
func TestConfigHTTPBearerToken(t *testing.T) {
	is := is.New(t)
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	path := writeDir(t, map[string]string{"channels.toml": `
[channels.push]
kind = "http"
mode = "idempotent"
url = "` + srv.URL + `"
token_env = "PUSH_TOKEN"
[channels.sms]
kind = "http"
mode = "none"
url = "` + srv.URL + `"
`})
	routes, err := channelconfig.Load(path, env(map[string]string{"PUSH_TOKEN": "tok-123\n"}))
	is.NoErr(err) // valid
	msg := delivery.Message{Ref: "r1", IdempotencyKey: "k1", To: "u1@push", Body: "b", ExpiresAt: time.Now().Add(time.Hour)}
	obs := routes["push"].Client.Send(context.Background(), msg)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused) // a 401 to a channel that sends a credential
	routes["sms"].Client.Send(context.Background(), msg)
	is.Equal(auth, []string{"Bearer tok-123", ""}) // the token, its newline trimmed; none without the key
}

func TestConfigInvalid(t *testing.T) {
	vapidKey := vapidPEM(t)
	const httpOK = "[channels.push]\nkind = \"http\"\nmode = \"idempotent\"\nurl = \"https://push.example\"\n"
	cases := []struct {
		name   string
		toml   string
		env    map[string]string
		want   []string // parts of the error
		secret string   // must not appear in the error
	}{
		{"unknown key", httpOK + "colour = \"red\"\n", nil, []string{`channel "push"`, `unknown key "colour"`}, ""},
		{"unknown table", "[chanels.push]\nkind = \"http\"\n", nil, []string{`unknown key "chanels`}, ""},
		{"inline password", "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\nusername = \"u\"\npassword = \"hunter2\"\n",
			nil, []string{`channel "email"`, "password: secrets only from password_env/password_file"}, "hunter2"},
		{"inline webhook secret", "[channels.hooks]\nkind = \"webhook\"\nsecret = \"" + webhookSecret + "\"\n",
			nil, []string{`channel "hooks"`, "secret: secrets only from secret_env/secret_file"}, webhookSecret},
		{"smtp claims idempotent", "[channels.email]\nkind = \"smtp\"\nmode = \"idempotent\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\n",
			nil, []string{`channel "email"`, `mode "idempotent"`, "neither idempotency keys nor queries"}, ""},
		{"webhook claims queryable", "[channels.hooks]\nkind = \"webhook\"\nmode = \"queryable\"\nsecret_env = \"S\"\n",
			map[string]string{"S": webhookSecret}, []string{`channel "hooks"`, `mode "queryable"`, "no query"}, ""},
		{"bad allowed_networks", "[channels.hooks]\nkind = \"webhook\"\nsecret_env = \"S\"\nallowed_networks = [\"10.0.0.1/8\"]\n",
			map[string]string{"S": webhookSecret}, []string{`channel "hooks"`, `allowed_networks: "10.0.0.1/8" has bits set beyond its /8`}, ""},
		{"allowed_networks not a list", "[channels.hooks]\nkind = \"webhook\"\nsecret_env = \"S\"\nallowed_networks = \"10.0.0.0/8\"\n",
			map[string]string{"S": webhookSecret}, []string{`channel "hooks"`, "allowed_networks"}, ""},
		{"allowed_networks on http", httpOK + "allowed_networks = [\"10.0.0.0/8\"]\n", nil, []string{`allowed_networks does not apply to kind "http" (it is a key of webhook, webpush)`}, ""},
		{"webpush claims idempotent", "[channels.b]\nkind = \"webpush\"\nmode = \"idempotent\"\n", nil, []string{`channel "b"`, `mode "idempotent"`}, ""},
		{"http without mode", "[channels.push]\nkind = \"http\"\nurl = \"https://push.example\"\n", nil, []string{`channel "push"`, "mode: required"}, ""},
		{"unknown kind", "[channels.sms]\nkind = \"carrier-pigeon\"\n", nil, []string{`channel "sms"`, `kind "carrier-pigeon"`}, ""},
		{"no kind", "[channels.sms]\nmode = \"none\"\n", nil, []string{`channel "sms"`, "kind: required"}, ""},
		{"key of another kind", httpOK + "addr = \"smtp.example:25\"\n", nil, []string{`channel "push"`, `addr does not apply to kind "http"`}, ""},
		{"inline http token", httpOK + "token = \"tok-123\"\n", nil, []string{`channel "push"`, "token: secrets only from an _env or _file key"}, "tok-123"},
		{"http token from an unset variable", httpOK + "token_env = \"PUSH_TOKEN\"\n", nil, []string{`channel "push"`, "token_env: environment variable PUSH_TOKEN is unset or empty"}, ""},
		{"http token twice", httpOK + "token_env = \"PUSH_TOKEN\"\ntoken_file = \"tok\"\n", map[string]string{"PUSH_TOKEN": "tok-123"},
			[]string{`channel "push"`, "token_env and token_file: give one, not both"}, "tok-123"},
		{"topic resend on http", httpOK + "resend_with_topic = true\n", nil, []string{`resend_with_topic does not apply to kind "http"`}, ""},
		{"collapse resend on webpush", "[channels.web]\nkind = \"webpush\"\nresend_with_collapse = true\n", nil, []string{`channel "web"`, `resend_with_collapse does not apply to kind "webpush"`}, ""},
		{"key of another kind names its owner", httpOK + "vapid_subject = \"mailto:a@b.example\"\n", nil, []string{`vapid_subject does not apply to kind "http" (it is a key of webpush)`}, ""},
		{"window on queryable", "[channels.sms]\nkind = \"http\"\nmode = \"queryable\"\nurl = \"https://sms.example\"\nidempotency_window = \"24h\"\n",
			nil, []string{`channel "sms"`, "idempotency_window applies to mode idempotent only"}, ""},
		{"settle on idempotent", httpOK + "query_settle = \"30s\"\n", nil, []string{"query_settle applies to mode queryable only"}, ""},
		{"bad duration", httpOK + "idempotency_window = \"1 day\"\n", nil, []string{`channel "push"`, `idempotency_window "1 day"`}, ""},
		{"negative duration", httpOK + "max_in_flight_age = \"-1h\"\n", nil, []string{`max_in_flight_age "-1h"`}, ""},
		{"zero duration", "[channels.sms]\nkind = \"http\"\nmode = \"queryable\"\nurl = \"https://sms.example\"\nquery_settle = \"0s\"\n",
			nil, []string{`channel "sms"`, `query_settle "0s": want a positive duration`}, ""},
		{"wrong type", httpOK + "server_errors_uncertain = \"yes\"\n", nil, []string{"server_errors_uncertain"}, ""},
		{"bad url", "[channels.push]\nkind = \"http\"\nmode = \"none\"\nurl = \"ftp://u:hunter2@example.com\"\n",
			nil, []string{`channel "push"`, "url:"}, "hunter2"},
		{"password env unset", "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\nusername = \"u\"\npassword_env = \"SMTP_PASSWORD\"\n",
			nil, []string{`channel "email"`, "password_env: environment variable SMTP_PASSWORD is unset or empty"}, ""},
		{"password without username", "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\npassword_env = \"P\"\n",
			map[string]string{"P": "pw"}, []string{"username: required"}, ""},
		{"both secret sources", "[channels.hooks]\nkind = \"webhook\"\nsecret_env = \"S\"\nsecret_file = \"s\"\n",
			map[string]string{"S": webhookSecret}, []string{"secret_env and secret_file: give one, not both"}, ""},
		{"no secret", "[channels.hooks]\nkind = \"webhook\"\n", nil, []string{`channel "hooks"`, "secret_env or secret_file: required"}, ""},
		{"secret file missing", "[channels.hooks]\nkind = \"webhook\"\nsecret_file = \"nope\"\n", nil, []string{"secret_file:", "nope"}, ""},
		{"malformed webhook secret", "[channels.hooks]\nkind = \"webhook\"\nsecret_env = \"S\"\n",
			map[string]string{"S": "whsec_c2hvcnQtc2VjcmV0LXZhbHVl"}, []string{`channel "hooks"`, "secret: webhook secret"}, "c2hvcnQtc2VjcmV0LXZhbHVl"},
		{"bad vapid key", "[channels.b]\nkind = \"webpush\"\nvapid_private_key_env = \"K\"\nvapid_subject = \"mailto:a@example.com\"\n",
			map[string]string{"K": "not-a-key-but-secret-looking"}, []string{`channel "b"`, "vapid_private_key"}, "not-a-key-but-secret-looking"},
		{"no vapid subject", "[channels.b]\nkind = \"webpush\"\nvapid_private_key_env = \"K\"\n", map[string]string{"K": vapidKey}, []string{`channel "b"`, "vapid_subject: required"}, ""},
		{"bad starttls", "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\nstarttls = \"maybe\"\n",
			nil, []string{`channel "email"`, `starttls "maybe"`}, ""},
		{"smtp without from", "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\n", nil, []string{"addr and from: required"}, ""},
		{"bad channel name", "[channels.\"Push!\"]\nkind = \"http\"\nmode = \"none\"\nurl = \"https://push.example\"\n", nil, []string{`channel "Push!"`, "invalid name"}, ""},
		{"empty file", "", nil, []string{"no [channels.NAME] table"}, ""},
		{"rate limit zero", httpOK + "rate_limit = \"0/s\"\n", nil, []string{"channels.toml", `channel "push"`, `rate_limit "0/s": not positive`}, ""},
		{"rate limit negative", httpOK + "rate_limit = \"-1/s\"\n", nil, []string{`channel "push"`, `rate_limit "-1/s": not positive`}, ""},
		{"rate limit words", httpOK + "rate_limit = \"fast\"\n", nil, []string{`channel "push"`, `rate_limit "fast"`, `such as "50/s"`}, ""},
		{"rate limit without unit", httpOK + "rate_limit = \"50\"\n", nil, []string{`rate_limit "50": no unit`}, ""},
		{"rate limit per day", httpOK + "rate_limit = \"5000/day\"\n", nil, []string{`rate_limit "5000/day": unknown unit`}, ""},
		{"rate limit NaN", httpOK + "rate_limit = \"NaN/s\"\n", nil, []string{`rate_limit "NaN/s": not a number`}, ""},
		{"rate limit too high", httpOK + "rate_limit = \"2000000/s\"\n", nil, []string{`rate_limit "2000000/s": more than 1000000/s`}, ""},
		{"rate limit a number", httpOK + "rate_limit = 50\n", nil, []string{"rate_limit"}, ""},
		{"burst zero", httpOK + "rate_limit = \"50/s\"\nburst = 0\n", nil, []string{`channel "push"`, "burst 0: want a whole number of calls from 1"}, ""},
		{"burst negative", httpOK + "rate_limit = \"50/s\"\nburst = -5\n", nil, []string{"burst -5"}, ""},
		{"burst too high", httpOK + "rate_limit = \"50/s\"\nburst = 1000001\n", nil, []string{`channel "push"`, "burst 1000001: want a whole number of calls from 1 to 1000000"}, ""},
		{"burst fraction", httpOK + "rate_limit = \"50/s\"\nburst = 2.5\n", nil, []string{"burst"}, ""},
		{"burst without rate limit", httpOK + "burst = 10\n", nil, []string{`channel "push"`, "burst: applies only with rate_limit"}, ""},
		{"syntax error", "[channels.push\nkind = \"http\"\n", nil, []string{"channels.toml"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			path := writeDir(t, map[string]string{"channels.toml": tc.toml})
			_, err := channelconfig.Load(path, env(tc.env))
			is.True(err != nil)                               // refused
			is.True(errors.Is(err, delivery.ErrInvalidInput)) // as bad input
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
			t.Log(err)
			is.True(tc.secret == "" || !strings.Contains(err.Error(), tc.secret)) // never shows a secret
			is.True(!strings.Contains(err.Error(), "\n"))                         // one line
		})
	}

	is := is.New(t)
	_, err := channelconfig.Load(filepath.Join(t.TempDir(), "missing.toml"), env(nil))
	is.True(err != nil && strings.Contains(err.Error(), "missing.toml"))           // a missing file names itself
	is.True(base64.StdEncoding.EncodedLen(24) == len(webhookSecret)-len("whsec_")) // the test secret is 24 bytes
}

// The example channels files of testdata/channels, one per kind, load as they are (their secrets from
// the environment they name, or a key file written beside a copy).
func TestExampleChannelsFilesLoad(t *testing.T) {
	examples, err := filepath.Glob("../../testdata/channels/*.toml")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no example channels files: %v", err)
	}
	secrets := env(map[string]string{"WEBHOOK_SECRET": webhookSecret, "SMTP_PASSWORD": "hunter2", "RESEND_API_KEY": "re_example", "POSTMARK_SERVER_TOKEN": "pm-example",
		"TWILIO_API_KEY_SECRET": "tw-example", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "ses-example"})
	for _, path := range examples {
		t.Run(filepath.Base(path), func(t *testing.T) {
			is := is.New(t)
			data, err := os.ReadFile(path)
			is.NoErr(err)
			routes, err := channelconfig.Load(writeDir(t, map[string]string{"channels.toml": string(data), "vapid.pem": vapidPEM(t),
				"fcm-service-account.json": serviceAccountJSON(t), "AuthKey_ABC123DEFG.p8": apnsP8(t)}), secrets)
			is.NoErr(err)            // loads
			is.True(len(routes) > 0) // with its channels
			for name, r := range routes {
				is.True(r.Client != nil) // each with a client
				t.Logf("%s: %s", name, r.Mode)
			}
		})
	}
}
