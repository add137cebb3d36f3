package webpush

import (
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"

	"github.com/matryer/is"
)

// TestChannelWebPushRFC8291Vector: encrypt reproduces the example of RFC 8291 Appendix A byte for
// byte (fixed sender key and salt; testdata/vectors/rfc8291.json).
func TestChannelWebPushRFC8291Vector(t *testing.T) {
	is := is.New(t)
	var v struct {
		Plaintext  string `json:"plaintext"`
		ASPrivate  string `json:"as_private"`
		ASPublic   string `json:"as_public"`
		UAPublic   string `json:"ua_public"`
		AuthSecret string `json:"auth_secret"`
		Salt       string `json:"salt"`
		Body       string `json:"body"`
	}
	data, err := os.ReadFile("../../testdata/vectors/rfc8291.json")
	is.NoErr(err)
	is.NoErr(json.Unmarshal(data, &v))
	dec := func(s string) []byte {
		b, err := base64.RawURLEncoding.DecodeString(s)
		is.NoErr(err) // test vector is base64url
		return b
	}
	as, err := ecdh.P256().NewPrivateKey(dec(v.ASPrivate))
	is.NoErr(err)                                                                      // application server key
	is.Equal(base64.RawURLEncoding.EncodeToString(as.PublicKey().Bytes()), v.ASPublic) // its public key
	ua, err := ecdh.P256().NewPublicKey(dec(v.UAPublic))
	is.NoErr(err) // user agent key
	body, err := encrypt([]byte(v.Plaintext), ua, dec(v.AuthSecret), as, dec(v.Salt))
	is.NoErr(err)                                                // encrypted
	is.Equal(base64.RawURLEncoding.EncodeToString(body), v.Body) // RFC 8291 Appendix A
}
