package channelconfig_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

// serviceAccountJSON is a Google service-account key file with a fresh RSA key.
func serviceAccountJSON(t *testing.T) string {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"type": "service_account", "project_id": "demo-project", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "notifier@demo-project.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"})
	return string(b)
}

func TestConfigFCM(t *testing.T) {
	is := is.New(t)
	path := writeDir(t, map[string]string{"channels.toml": `
[channels.app]
kind = "fcm"
service_account_file = "sa.json"
resend_with_collapse = true
`, "sa.json": serviceAccountJSON(t)})
	routes, err := channelconfig.Load(path, env(nil))
	is.NoErr(err)
	is.Equal(routes["app"].Mode, delivery.ModeNone) // the default, and the only mode
	// collapse resend; FCM's 5xx may follow acceptance, its 429 is documented as rejected
	is.Equal(routes["app"].Contract, delivery.Contract{ResendWithTopic: true, ServerErrorsUncertain: true, ThrottleRefuses: true})
	is.Equal(routes["app"].Client.(interface{ String() string }).String(), "fcm") // the FCM adapter
}

func TestConfigFCMInvalid(t *testing.T) {
	sa := serviceAccountJSON(t)
	const base = "[channels.app]\nkind = \"fcm\"\nservice_account_env = \"SA\"\n"
	for _, tc := range []struct {
		name string
		toml string
		env  map[string]string
		want []string
	}{
		{"claims idempotent", base + "mode = \"idempotent\"\n", map[string]string{"SA": sa}, []string{`channel "app"`, `mode "idempotent"`, "kind fcm offers neither"}},
		{"claims queryable", base + "mode = \"queryable\"\n", map[string]string{"SA": sa}, []string{`mode "queryable"`}},
		{"topic key", base + "resend_with_topic = true\n", map[string]string{"SA": sa}, []string{`resend_with_topic does not apply to kind "fcm"`}},
		{"no account", "[channels.app]\nkind = \"fcm\"\n", nil, []string{"service_account_env or service_account_file: required"}},
		{"not a key file", base, map[string]string{"SA": "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----"}, []string{"service_account:", "not a JSON key file"}},
		{"bad key", base, map[string]string{"SA": strings.Replace(sa, "MII", "XXX", 1)}, []string{"service_account:", "private_key"}},
		{"plain http endpoint", base + "endpoint = \"http://fcm.example\"\n", map[string]string{"SA": sa}, []string{"fcm:", "want an https URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := channelconfig.Load(writeDir(t, map[string]string{"channels.toml": tc.toml}), env(tc.env))
			is.True(errors.Is(err, delivery.ErrInvalidInput))
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
			is.True(!strings.Contains(err.Error(), "BEGIN") && !strings.Contains(err.Error(), "c2VjcmV0")) // no key material
		})
	}
}
