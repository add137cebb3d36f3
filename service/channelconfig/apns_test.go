package channelconfig_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

// apnsP8 is an APNs authentication key as Apple hands it out (PKCS#8 PEM, P-256).
func apnsP8(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func TestConfigAPNs(t *testing.T) {
	is := is.New(t)
	path := writeDir(t, map[string]string{"channels.toml": `
[channels.ios]
kind = "apns"
auth_key_file = "key.p8"
key_id = "ABC123DEFG"
team_id = "DEF123GHIJ"
topic = "com.example.app"
environment = "sandbox"
resend_with_collapse = true
`, "key.p8": apnsP8(t)})
	routes, err := channelconfig.Load(path, env(nil))
	is.NoErr(err)
	is.Equal(routes["ios"].Mode, delivery.ModeNone)
	// collapse resend; Apple does not say a 5xx or 429 comes before acceptance: both uncertain
	is.Equal(routes["ios"].Contract, delivery.Contract{ResendWithTopic: true, ServerErrorsUncertain: true})
}

func TestConfigAPNsInvalid(t *testing.T) {
	p8 := apnsP8(t)
	const base = "[channels.ios]\nkind = \"apns\"\nauth_key_env = \"K\"\nkey_id = \"ABC123DEFG\"\nteam_id = \"DEF123GHIJ\"\ntopic = \"com.example.app\"\n"
	ok := map[string]string{"K": p8}
	for _, tc := range []struct {
		name string
		toml string
		env  map[string]string
		want []string
	}{
		{"claims idempotent", base + "mode = \"idempotent\"\n", ok, []string{`channel "ios"`, `mode "idempotent"`, "kind apns offers neither"}},
		{"claims queryable", base + "mode = \"queryable\"\n", ok, []string{`mode "queryable"`}},
		{"topic resend key", base + "resend_with_topic = true\n", ok, []string{`resend_with_topic does not apply to kind "apns"`}},
		{"no key", "[channels.ios]\nkind = \"apns\"\n", nil, []string{"auth_key_env or auth_key_file: required"}},
		{"bad key", base, map[string]string{"K": "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----"}, []string{"auth_key:", ".p8"}},
		{"short key id", strings.Replace(base, "ABC123DEFG", "ABC", 1), ok, []string{"apns:", "key_id and team_id"}},
		{"no topic", strings.Replace(base, "topic = \"com.example.app\"\n", "", 1), ok, []string{"apns:", "topic: required"}},
		{"bad environment", base + "environment = \"staging\"\n", ok, []string{`environment "staging"`}},
		{"bad push type", base + "push_type = \"voip\"\n", ok, []string{`push_type "voip"`}},
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
