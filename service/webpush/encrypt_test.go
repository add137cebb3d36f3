package webpush

import (
	"crypto/ecdh"
	"encoding/base64"
	"testing"

	"github.com/matryer/is"
)

// TestChannelWebPushRFC8291Vector: encrypt reproduces the example of RFC 8291 Appendix A byte for
// byte (fixed sender key and salt).
func TestChannelWebPushRFC8291Vector(t *testing.T) {
	is := is.New(t)
	dec := func(s string) []byte {
		b, err := base64.RawURLEncoding.DecodeString(s)
		is.NoErr(err) // test vector is base64url
		return b
	}
	as, err := ecdh.P256().NewPrivateKey(dec("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"))
	is.NoErr(err) // application server key
	is.Equal(base64.RawURLEncoding.EncodeToString(as.PublicKey().Bytes()),
		"BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8") // its public key
	ua, err := ecdh.P256().NewPublicKey(dec("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"))
	is.NoErr(err) // user agent key
	body, err := encrypt([]byte("When I grow up, I want to be a watermelon"), ua, dec("BTBZMqHH6r4Tts7J_aSIgg"), as, dec("DGv6ra1nlYgDCS1FRnbzlw"))
	is.NoErr(err) // encrypted
	is.Equal(base64.RawURLEncoding.EncodeToString(body),
		"DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN") // RFC 8291 Appendix A
}
