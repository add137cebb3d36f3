package smtpchannel_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/smtpchannel"
)

// relay is a real SMTP server (go-smtp) on loopback whose replies the test scripts.
type relay struct {
	addr string

	mu       sync.Mutex
	received []received
	rcptErr  error         // returned from RCPT
	dataErr  error         // returned after the message was read
	withhold chan struct{} // if set, the reply to the end of data waits for it to close
	drop     bool          // after recording a message, close the connection instead of replying
	sessions int           // connections the relay served
	datas    int           // DATA transactions whose text reached the end
	user     string
	pass     string
}

type received struct {
	from, to string
	data     []byte
	tls      bool
}

type relaySession struct {
	r        *relay
	conn     *smtp.Conn
	authed   bool
	from, to string
}

func (r *relay) NewSession(c *smtp.Conn) (smtp.Session, error) {
	r.mu.Lock()
	r.sessions++
	r.mu.Unlock()
	return &relaySession{r: r, conn: c}, nil
}

func (s *relaySession) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *relaySession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(identity, username, password string) error {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		if username != s.r.user || password != s.r.pass {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "bad credentials"}
		}
		s.authed = true
		return nil
	}), nil
}

func (s *relaySession) Mail(from string, _ *smtp.MailOptions) error {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if s.r.user != "" && !s.authed {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "authentication required"}
	}
	s.from = from
	return nil
}

func (s *relaySession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if s.r.rcptErr != nil {
		return s.r.rcptErr
	}
	s.to = to
	return nil
}

func (s *relaySession) Data(rd io.Reader) error {
	data, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	_, isTLS := s.conn.TLSConnectionState()
	s.r.mu.Lock()
	s.r.datas++
	if s.r.dataErr != nil {
		err := s.r.dataErr
		s.r.mu.Unlock()
		return err
	}
	s.r.received = append(s.r.received, received{from: s.from, to: s.to, data: data, tls: isTLS})
	hold, drop := s.r.withhold, s.r.drop
	s.r.mu.Unlock()
	if drop {
		_ = s.conn.Conn().Close() // the message is complete and recorded; no reply ever comes
		return nil
	}
	if hold != nil {
		<-hold // the message is complete and recorded; the 250 is withheld
	}
	return nil
}

func (s *relaySession) Reset()        {}
func (s *relaySession) Logout() error { return nil }

func (r *relay) set(f func(*relay)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func (r *relay) messages() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.received...)
}

// startRelay serves go-smtp on 127.0.0.1; with cert it offers STARTTLS.
func startRelay(t *testing.T, cert *tls.Certificate) *relay {
	t.Helper()
	r := &relay{}
	srv := smtp.NewServer(r)
	srv.Domain = "relay.test"
	srv.AllowInsecureAuth = true
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	if cert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

// testCert makes a self-signed certificate for 127.0.0.1 and writes it as a CA file.
func testCert(t *testing.T) (*tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, file
}

func newClient(t *testing.T, opt smtpchannel.Options) *smtpchannel.Client {
	t.Helper()
	if opt.From == "" {
		opt.From = "Notifier <noreply@example.com>"
	}
	if opt.StartTLS == "" {
		opt.StartTLS = smtpchannel.TLSNone
	}
	c, err := smtpchannel.New(opt)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

const body = "Your order has shipped\n.a line starting with a dot\nÜmlaut and € sign"

func message() delivery.Message {
	return delivery.Message{Ref: "task-7", IdempotencyKey: "ntf-task-7", To: "Ann <ann@example.org>", Body: body,
		ExpiresAt: time.Now().Add(time.Hour), Action: delivery.ActionSend}
}

func send(c *smtpchannel.Client, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, message())
}

func TestChannelSMTPAccept(t *testing.T) {
	is := is.New(t)
	r := startRelay(t, nil)
	r.set(func(r *relay) { r.user, r.pass = "notifier", "s3cret-pw" })
	c := newClient(t, smtpchannel.Options{Addr: r.addr, Username: "notifier", Password: "s3cret-pw",
		MessageIDDomain: "notify.example.com", SubjectPrefix: "[Shop] ", HeloName: "worker.example.com"})

	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)                // 250 after the end of data
	is.Equal(obs.ProviderMsgID, "<ntf-task-7@notify.example.com>") // the Message-ID
	msgs := r.messages()
	is.Equal(len(msgs), 1)                        // one message
	is.Equal(msgs[0].from, "noreply@example.com") // envelope sender
	is.Equal(msgs[0].to, "ann@example.org")       // envelope recipient
	m, err := mail.ReadMessage(bytes.NewReader(msgs[0].data))
	is.NoErr(err)                                                           // a valid message
	is.Equal(m.Header.Get("Message-ID"), "<ntf-task-7@notify.example.com>") // stable Message-ID
	from, err := m.Header.AddressList("From")
	is.NoErr(err)                                    // From parses
	is.Equal(from[0].Address, "noreply@example.com") // From
	to, err := m.Header.AddressList("To")
	is.NoErr(err)                              // To parses
	is.Equal(to[0].Address, "ann@example.org") // To
	subject, err := new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject"))
	is.NoErr(err)                                      // Subject decodes
	is.Equal(subject, "[Shop] Your order has shipped") // prefix + first line
	_, err = m.Header.Date()
	is.NoErr(err)                                                           // Date parses
	is.Equal(m.Header.Get("MIME-Version"), "1.0")                           // MIME
	is.Equal(m.Header.Get("Content-Type"), "text/plain; charset=utf-8")     // plain UTF-8 text
	is.Equal(m.Header.Get("Content-Transfer-Encoding"), "quoted-printable") // 7-bit safe
	text, err := io.ReadAll(quotedprintable.NewReader(m.Body))
	is.NoErr(err)                                                                            // body decodes
	is.Equal(strings.TrimSuffix(strings.ReplaceAll(string(text), "\r\n", "\n"), "\n"), body) // the body, dot line intact

	// The same task again carries the same Message-ID: a receiver-side dedupe hint.
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted again (SMTP cannot dedupe)
	m2, err := mail.ReadMessage(bytes.NewReader(r.messages()[1].data))
	is.NoErr(err)                                                     // second copy
	is.Equal(m2.Header.Get("Message-ID"), m.Header.Get("Message-ID")) // same Message-ID

	wrong := newClient(t, smtpchannel.Options{Addr: r.addr, Username: "notifier", Password: "guess"})
	obs = send(wrong, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 535: authentication failed
	is.True(strings.Contains(obs.Detail, "535"))    // says so
	is.True(!strings.Contains(obs.Detail, "guess")) // without the password
	is.Equal(len(r.messages()), 2)                  // nothing more delivered

	anon := newClient(t, smtpchannel.Options{Addr: r.addr})
	obs = send(anon, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 530: the relay requires AUTH (so the first send did AUTH)
	is.Equal(len(r.messages()), 2)                  // nothing more delivered

	q := c.Query(context.Background(), "task-7")
	is.Equal(q.Outcome, delivery.OutcomeQueryFailed) // SMTP has no query
	is.Equal(q.Detail, "not supported")              // says so
}

func TestChannelSMTPReject(t *testing.T) {
	is := is.New(t)
	r := startRelay(t, nil)
	c := newClient(t, smtpchannel.Options{Addr: r.addr})
	r.set(func(r *relay) {
		r.rcptErr = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	})
	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)   // 550 is permanent
	is.True(strings.Contains(obs.Detail, "SMTP 550")) // says so
	is.True(strings.Contains(obs.Detail, "RCPT"))     // and where
	is.Equal(len(r.messages()), 0)                    // nothing delivered

	obs = c.Send(context.Background(), delivery.Message{IdempotencyKey: "ntf-task-7", To: "not an address", Body: "x"})
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // a bad address is refused locally
}

func TestChannelSMTPTemporary(t *testing.T) {
	is := is.New(t)
	r := startRelay(t, nil)
	c := newClient(t, smtpchannel.Options{Addr: r.addr})
	r.set(func(r *relay) {
		r.dataErr = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	})
	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeHTTP5xx)       // 451 at the end of data: refused, retry
	is.True(strings.HasPrefix(obs.Detail, "SMTP 451"))   // documented detail
	is.True(strings.Contains(obs.Detail, "end of data")) // at the end of data
	is.Equal(len(r.messages()), 0)                       // not delivered
}

// TestChannelSMTPWithheldReply: the relay reads the whole message, records it, and withholds the 250.
// The client times out after the final dot: the outcome is unknown (TIMEOUT), and indeed the relay
// has the message.
func TestChannelSMTPWithheldReply(t *testing.T) {
	is := is.New(t)
	r := startRelay(t, nil)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	r.set(func(r *relay) { r.withhold = hold })
	c := newClient(t, smtpchannel.Options{Addr: r.addr})

	start := time.Now()
	obs := send(c, 500*time.Millisecond)
	is.Equal(obs.Outcome, delivery.OutcomeTimeout)           // uncertain: maybe accepted
	is.True(strings.Contains(obs.Detail, "outcome unknown")) // says so
	is.True(time.Since(start) < 3*time.Second)               // bounded by the context
	is.Equal(len(r.messages()), 1)                           // the relay has the complete message
}

// TestChannelSMTPOneMessagePerAttempt: the relay takes the whole message (the final "." included),
// records it, and drops the connection instead of replying. The attempt is uncertain (IO_ERROR) and
// the relay received exactly one message on one connection: nothing in the client sends DATA again.
// Why nothing can: the client (this package) opens one connection per Send and never reconnects,
// sends its commands one at a time and waits for each reply (no PIPELINING, even when offered),
// issues DATA once and never RSETs to try again; net/textproto, crypto/tls and net.Dialer do not
// retry a write (a dialer may try several addresses, but only to connect, before any command).
func TestChannelSMTPOneMessagePerAttempt(t *testing.T) {
	is := is.New(t)
	r := startRelay(t, nil)
	r.set(func(r *relay) { r.drop = true })
	c := newClient(t, smtpchannel.Options{Addr: r.addr})

	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeIOError)           // uncertain: the relay may have taken it
	is.True(strings.Contains(obs.Detail, "outcome unknown")) // says so
	r.mu.Lock()
	sessions, datas := r.sessions, r.datas
	r.mu.Unlock()
	is.Equal(sessions, 1)          // one connection
	is.Equal(datas, 1)             // one DATA
	is.Equal(len(r.messages()), 1) // one message received
}

// rawRelay is a hand-scripted SMTP peer for failures go-smtp will not produce.
func rawRelay(t *testing.T, script func(c net.Conn, rd *bufio.Reader)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				script(c, bufio.NewReader(c))
			}()
		}
	}()
	return l.Addr().String()
}

// converse answers the usual commands with 250 (354 for DATA) until stop returns true for a line.
func converse(c net.Conn, rd *bufio.Reader, stop func(line string) bool) {
	_, _ = io.WriteString(c, "220 raw.test ESMTP\r\n")
	inData := false
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		if stop(line) {
			return
		}
		switch {
		case inData && line == ".":
			inData = false
			_, _ = io.WriteString(c, "250 queued\r\n")
		case inData:
		case strings.HasPrefix(line, "EHLO"):
			_, _ = io.WriteString(c, "250-raw.test\r\n250 8BITMIME\r\n")
		case line == "DATA":
			inData = true
			_, _ = io.WriteString(c, "354 go ahead\r\n")
		case line == "QUIT":
			_, _ = io.WriteString(c, "221 bye\r\n")
			return
		default:
			_, _ = io.WriteString(c, "250 ok\r\n")
		}
	}
}

// TestChannelSMTPConnectionFailures: failures before the final dot are certain refusals
// (CONNECT_FAILED); a broken connection after it is IO_ERROR (outcome unknown).
func TestChannelSMTPConnectionFailures(t *testing.T) {
	is := is.New(t)
	clientGaveUp := make(chan struct{}) // the stalling relay holds its connection, unread, until then
	cases := []struct {
		name   string
		script func(c net.Conn, rd *bufio.Reader)
		want   delivery.Outcome
		detail string
	}{
		{"closed before greeting", func(net.Conn, *bufio.Reader) {}, delivery.OutcomeConnectFailed, "before the server greeting"},
		{"closed at RCPT", func(c net.Conn, rd *bufio.Reader) {
			converse(c, rd, func(l string) bool { return strings.HasPrefix(l, "RCPT") })
		}, delivery.OutcomeConnectFailed, "RCPT"},
		{"relay stalls during message text", func(c net.Conn, rd *bufio.Reader) {
			converse(c, rd, func(l string) bool {
				if l != "DATA" {
					return false
				}
				_, _ = io.WriteString(c, "354 go ahead\r\n")
				<-clientGaveUp // reads nothing more: the client's writes block
				return true
			})
		}, delivery.OutcomeConnectFailed, "timeout at message text"},
		{"closed after the final dot", func(c net.Conn, rd *bufio.Reader) {
			data := false
			converse(c, rd, func(l string) bool {
				if l == "DATA" {
					data = true
				}
				return data && l == "."
			})
		}, delivery.OutcomeIOError, "outcome unknown"},
		{"421 greeting", func(c net.Conn, rd *bufio.Reader) {
			_, _ = io.WriteString(c, "421 too busy\r\n")
		}, delivery.OutcomeHTTP5xx, "SMTP 421"},
		{"not SMTP", func(c net.Conn, rd *bufio.Reader) {
			_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		}, delivery.OutcomeConnectFailed, "not an SMTP reply"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := newClient(t, smtpchannel.Options{Addr: rawRelay(t, tc.script)})
			msg, timeout := message(), time.Second
			if strings.Contains(tc.name, "stalls") { // more than the socket buffers hold (4 MiB + 128 KiB here)
				msg.Body, timeout = strings.Repeat("a long message that fills the socket buffers\n", 1<<17), 3*time.Second // 6 MB
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			obs := c.Send(ctx, msg)
			if strings.Contains(tc.name, "stalls") {
				close(clientGaveUp)
			}
			is.Equal(obs.Outcome, tc.want) // mapped by whether the final dot was sent
			if !strings.Contains(obs.Detail, tc.detail) {
				t.Fatalf("detail %q does not name %q", obs.Detail, tc.detail)
			}
		})
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err) // a free port
	addr := l.Addr().String()
	is.NoErr(l.Close())
	c := newClient(t, smtpchannel.Options{Addr: addr})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeConnectFailed) // nothing listens
}

func TestChannelSMTPStartTLS(t *testing.T) {
	is := is.New(t)
	cert, caFile := testCert(t)
	r := startRelay(t, cert)
	r.set(func(r *relay) { r.user, r.pass = "notifier", "pw" })

	c := newClient(t, smtpchannel.Options{Addr: r.addr, StartTLS: smtpchannel.TLSRequired, CAFile: caFile, Username: "notifier", Password: "pw"})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted over TLS
	is.True(r.messages()[0].tls)                                       // the message went over TLS

	untrusted := newClient(t, smtpchannel.Options{Addr: r.addr, StartTLS: smtpchannel.TLSOpportunistic})
	obs := send(untrusted, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // the certificate is verified even when opportunistic
	is.True(strings.Contains(obs.Detail, "STARTTLS"))    // says so

	plain := startRelay(t, nil)
	required := newClient(t, smtpchannel.Options{Addr: plain.addr, StartTLS: smtpchannel.TLSRequired})
	obs = send(required, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed)             // no STARTTLS offered: not sent
	is.True(strings.Contains(obs.Detail, "does not offer STARTTLS")) // says so
	opportunistic := newClient(t, smtpchannel.Options{Addr: plain.addr, StartTLS: smtpchannel.TLSOpportunistic})
	is.Equal(send(opportunistic, 5*time.Second).Outcome, delivery.OutcomeAccepted) // plain text when not offered
	is.Equal(len(r.messages())+len(plain.messages()), 2)                           // two messages in all
}

func TestChannelSMTPOptions(t *testing.T) {
	is := is.New(t)
	for _, opt := range []smtpchannel.Options{
		{Addr: "smtp.example", From: "a@example.com"},
		{Addr: "smtp.example:587", From: "nobody"},
		{Addr: "smtp.example:587", From: "a@example.com", StartTLS: "sometimes"},
		{Addr: "smtp.example:587", From: "a@example.com", Username: "u"},
		{Addr: "smtp.example:587", From: "a@example.com", Username: "u", Password: "hunter2", StartTLS: smtpchannel.TLSNone},
		{Addr: "smtp.example:587", From: "a@example.com", MessageIDDomain: "bad domain"},
		{Addr: "smtp.example:587", From: "a@example.com", SubjectPrefix: "x\r\nBcc: evil@example.com"},
	} {
		_, err := smtpchannel.New(opt)
		is.True(errors.Is(err, delivery.ErrInvalidInput)) // refused
		if err != nil {
			is.True(!strings.Contains(err.Error(), opt.Password) || opt.Password == "") // no password in errors
		}
	}
	c, err := smtpchannel.New(smtpchannel.Options{Addr: "127.0.0.1:25", From: "a@example.com", Username: "u", Password: "p", StartTLS: smtpchannel.TLSNone})
	is.NoErr(err)                                                   // clear-text AUTH is allowed to a loopback relay
	is.Equal(c.MessageID("ntf-task-1"), "<ntf-task-1@example.com>") // default domain from From
}
