package webpush_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/webpush"
)

// pushService is a local RFC 8030 push service: it checks the VAPID token (RFC 8292) against the
// application server key each subscription was created with, decrypts the payload with the
// subscription's private key (RFC 8291), stores messages for their TTL with Topic replacement of
// undelivered ones (RFC 8030 section 5.4), and hands them to the "device" when the test delivers.
type pushService struct {
	srv      *httptest.Server
	caFile   string
	appKey   *ecdsa.PublicKey // the applicationServerKey the subscriptions were made with
	audience string

	mu         sync.Mutex
	devices    map[string]*device
	nextMsg    int
	requests   int
	conns      fakes.ConnCounter
	lastHeader http.Header
	script     []step        // consumed one per request; empty: store and answer 201 at once
	ahead      time.Duration // how far the push service's clock runs ahead of time.Now (wait)
}

// now is the push service's clock, which decides when a stored message's TTL has run out.
func (p *pushService) now() time.Time { return time.Now().Add(p.ahead) }

// wait moves the push service's clock on by d, as if d had passed for it, instead of sleeping.
func (p *pushService) wait(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ahead += d
}

// step scripts one request: refuse with status before storing, or store and delay the 201, or store
// and drop the connection without an answer.
type step struct {
	status int
	delay  time.Duration
	drop   bool
}

type device struct {
	priv   *ecdh.PrivateKey
	auth   []byte
	gone   bool
	stored []*storedMsg           // held by the push service, not yet delivered
	inbox  []webpush.Notification // delivered to the browser
}

type storedMsg struct {
	id      string
	topic   string
	expires time.Time
	n       webpush.Notification
}

func newPushService(t *testing.T, appKey *ecdsa.PublicKey) *pushService {
	t.Helper()
	p := &pushService{appKey: appKey, devices: map[string]*device{}}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.srv.Config.ConnState = p.conns.ConnState
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.audience = p.srv.URL // https://127.0.0.1:port
	p.caFile = filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	if err := os.WriteFile(p.caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// subscribe creates a browser subscription and returns its PushSubscription JSON.
func (p *pushService) subscribe(t *testing.T, name string) string {
	t.Helper()
	priv, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	auth := make([]byte, 16)
	_, _ = rand.Read(auth)
	p.mu.Lock()
	p.devices[name] = &device{priv: priv, auth: auth}
	p.mu.Unlock()
	sub := webpush.Subscription{Endpoint: p.srv.URL + "/push/" + name}
	sub.Keys.P256dh = base64.RawURLEncoding.EncodeToString(priv.PublicKey().Bytes())
	sub.Keys.Auth = base64.RawURLEncoding.EncodeToString(auth)
	b, _ := json.Marshal(sub)
	return string(b)
}

func (p *pushService) setScript(steps ...step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = steps
}

func (p *pushService) serve(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/push/")
	if r.Method != http.MethodPost || !ok {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, webpush.MaxPayloadBytes+1))
	if err != nil {
		return
	}
	p.mu.Lock()
	p.requests++
	p.lastHeader = r.Header.Clone()
	var st step
	if len(p.script) > 0 {
		st, p.script = p.script[0], p.script[1:]
	}
	if st.status != 0 {
		p.mu.Unlock()
		if st.status == http.StatusTooManyRequests || st.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "9")
		}
		http.Error(w, "scripted", st.status)
		return
	}
	code, msg := p.store(name, r.Header, body)
	p.mu.Unlock()
	if code != http.StatusCreated {
		http.Error(w, msg, code)
		return
	}
	if st.drop { // stored, and the connection breaks before the answer
		fakes.Drop(w, r)
		return
	}
	if st.delay > 0 { // stored: the message is accepted, only the answer is late
		select {
		case <-time.After(st.delay):
		case <-r.Context().Done():
			// The client gave up: no answer at all. Returning would make net/http send an implicit
			// 200, which a client still reading could take for an acceptance.
			panic(http.ErrAbortHandler)
		}
	}
	w.Header().Set("Location", p.srv.URL+"/m/"+msg)
	w.WriteHeader(http.StatusCreated)
}

var topicRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// store validates one push request and stores its message; it returns 201 and the message id, or an
// error status and reason. Called with mu held.
func (p *pushService) store(name string, h http.Header, body []byte) (int, string) {
	if err := verifyVAPID(h.Get("Authorization"), p.appKey, p.audience, time.Now()); err != nil {
		if errors.Is(err, errWrongKey) {
			return http.StatusForbidden, err.Error()
		}
		return http.StatusUnauthorized, err.Error()
	}
	d := p.devices[name]
	switch {
	case d == nil:
		return http.StatusNotFound, "no such subscription"
	case d.gone:
		return http.StatusGone, "subscription expired"
	}
	ttl, err := strconv.ParseInt(h.Get("TTL"), 10, 64)
	if err != nil || ttl < 0 {
		return http.StatusBadRequest, "TTL header missing or invalid"
	}
	if u := h.Get("Urgency"); u != "" && u != "very-low" && u != "low" && u != "normal" && u != "high" {
		return http.StatusBadRequest, "bad Urgency"
	}
	topic := h.Get("Topic")
	if topic != "" && !topicRE.MatchString(topic) {
		return http.StatusBadRequest, "bad Topic"
	}
	if h.Get("Content-Encoding") != "aes128gcm" {
		return http.StatusUnsupportedMediaType, "want aes128gcm"
	}
	if len(body) > webpush.MaxPayloadBytes {
		return http.StatusRequestEntityTooLarge, "payload too large"
	}
	plain, err := decrypt(body, d.priv, d.auth)
	if err != nil {
		return http.StatusBadRequest, "decrypt: " + err.Error()
	}
	var n webpush.Notification
	if err := json.Unmarshal(plain, &n); err != nil {
		return http.StatusBadRequest, "payload is not a notification"
	}
	p.nextMsg++
	m := &storedMsg{id: strconv.Itoa(p.nextMsg), topic: topic, expires: p.now().Add(time.Duration(ttl) * time.Second), n: n}
	if ttl == 0 {
		return http.StatusCreated, m.id // deliverable only to a connected device; ours is not
	}
	for i, old := range d.stored {
		if topic != "" && old.topic == topic {
			d.stored[i] = m // RFC 8030 5.4: replaces the undelivered message with the same topic
			return http.StatusCreated, m.id
		}
	}
	d.stored = append(d.stored, m)
	return http.StatusCreated, m.id
}

// deliver hands the device every stored message that has not expired; it returns how many.
func (p *pushService) deliver(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.devices[name]
	n := 0
	for _, m := range d.stored {
		if p.now().Before(m.expires) {
			d.inbox = append(d.inbox, m.n)
			n++
		}
	}
	d.stored = nil
	return n
}

func (p *pushService) inbox(name string) []webpush.Notification {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]webpush.Notification(nil), p.devices[name].inbox...)
}

func (p *pushService) header() http.Header {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastHeader.Clone()
}

func (p *pushService) connCount() int { return p.conns.Count() }

func (p *pushService) requestCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

var errWrongKey = errors.New("VAPID key is not the subscription's application server key")

// verifyVAPID checks an RFC 8292 Authorization header: "vapid t=<JWT>, k=<public key>"; the key is
// the one the subscription was made with; the JWT is ES256-signed by it, for this origin, not
// expired and not valid for more than 24 hours, with a mailto: or https: subject.
func verifyVAPID(header string, appKey *ecdsa.PublicKey, audience string, now time.Time) error {
	rest, ok := strings.CutPrefix(header, "vapid ")
	if !ok {
		return errors.New("not a vapid Authorization")
	}
	params := map[string]string{}
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		params[k] = v
	}
	kBytes, err := base64.RawURLEncoding.DecodeString(params["k"])
	if err != nil {
		return errors.New("bad k")
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), kBytes)
	if err != nil {
		return errors.New("k is not a P-256 point")
	}
	if !pub.Equal(appKey) {
		return errWrongKey
	}
	parts := strings.Split(params["t"], ".")
	if len(parts) != 3 {
		return errors.New("t is not a JWT")
	}
	var hdr struct{ Alg, Typ string }
	if b, err := base64.RawURLEncoding.DecodeString(parts[0]); err != nil || json.Unmarshal(b, &hdr) != nil || hdr.Alg != "ES256" {
		return errors.New("JWT header is not ES256")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return errors.New("JWT signature is not 64 bytes")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return errors.New("JWT signature does not verify")
	}
	var claims struct {
		Aud string
		Exp int64
		Sub string
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &claims) != nil {
		return errors.New("JWT claims unreadable")
	}
	exp := time.Unix(claims.Exp, 0)
	switch {
	case claims.Aud != audience:
		return fmt.Errorf("JWT aud %q, want %q", claims.Aud, audience)
	case !exp.After(now) || exp.After(now.Add(24*time.Hour)):
		return errors.New("JWT exp outside (now, now+24h]")
	case !strings.HasPrefix(claims.Sub, "mailto:") && !strings.HasPrefix(claims.Sub, "https:"):
		return errors.New("JWT sub is not mailto: or https:")
	}
	return nil
}

// decrypt is the browser's half of RFC 8291: parse the aes128gcm header, derive the key and nonce
// from ECDH with the sender's key and the auth secret, open the record and strip its padding.
func decrypt(body []byte, priv *ecdh.PrivateKey, auth []byte) ([]byte, error) {
	if len(body) < 21 {
		return nil, errors.New("short header")
	}
	salt, rs, idlen := body[:16], binary.BigEndian.Uint32(body[16:20]), int(body[20])
	if idlen != 65 || len(body) < 21+idlen+16 {
		return nil, errors.New("bad keyid")
	}
	asPub, err := ecdh.P256().NewPublicKey(body[21 : 21+idlen])
	if err != nil {
		return nil, err
	}
	ct := body[21+idlen:]
	if uint32(len(ct)) > rs {
		return nil, errors.New("more than one record")
	}
	secret, err := priv.ECDH(asPub)
	if err != nil {
		return nil, err
	}
	prkKey, _ := hkdf.Extract(sha256.New, secret, auth)
	info := append(append([]byte("WebPush: info\x00"), priv.PublicKey().Bytes()...), asPub.Bytes()...)
	ikm, _ := hkdf.Expand(sha256.New, prkKey, string(info), 32)
	prk, _ := hkdf.Extract(sha256.New, ikm, salt)
	cek, _ := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	nonce, _ := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	block, _ := aes.NewCipher(cek)
	gcm, _ := cipher.NewGCM(block)
	plain, err := gcm.Open(nil, nonce, ct, nil)
	if err != nil {
		return nil, errors.New("authentication failed")
	}
	plain = bytes.TrimRight(plain, "\x00")
	if len(plain) == 0 || plain[len(plain)-1] != 0x02 {
		return nil, errors.New("no last-record delimiter")
	}
	return plain[:len(plain)-1], nil
}
