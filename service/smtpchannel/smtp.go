// Package smtpchannel delivers notifications as plain-text email through an SMTP relay (RFC 5321),
// with optional STARTTLS (RFC 3207, certificates always verified) and AUTH PLAIN (RFC 4954).
//
// Contract: NONE. SMTP has no idempotency key and no way to ask a relay what it accepted. Every
// message carries a stable Message-ID, <ntf-<ref>@<domain>>, the same on every attempt: a hint a
// receiving system may use to drop a duplicate, nothing the relay promises.
//
// Where the outcome is certain and where it is not. A relay takes responsibility for a message only
// with a 2yz reply to the end-of-data indication, the final "." line (RFC 5321 sections 4.1.1.4 and
// 6.1). Until that line was sent the server holds at most an incomplete transaction, which it must
// not deliver: any failure before it (no connection, no greeting, a broken connection or a timeout
// during EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA or the message text) means "not accepted", and the
// client is to treat it like a 451 reply (section 3.8). Once the final "." was (possibly partly)
// written, a timeout or a broken connection before the reply leaves the outcome unknown: the relay
// may have accepted the message and only the reply was lost (section 4.5.3.2.6 warns that a resend
// then delivers twice).
//
// One message per attempt: a Send opens one connection and never reconnects, sends one command at a
// time and waits for its reply (no PIPELINING), issues DATA once and never retries after a reset, so
// whatever breaks, the relay receives the message at most once per attempt (R3).
//
// A relay that drops the connection while the text is being written is usually noticed only once
// the final "." went into the socket too (the kernel buffers the text): that is IO_ERROR, the
// conservative reading. A relay that stalls so that writing the text times out is CONNECT_FAILED.
//
// Mapping to observations:
//
//	2yz to the end of data            ACCEPTED, ProviderMsgID = the Message-ID
//	4yz at any step (421 greeting,    HTTP_5XX with Detail "SMTP 4yz ... (at STEP)": a temporary
//	  451 at the end of data, ...)      refusal, retried. RFC 5321 promises the relay did not take
//	                                    the message; notifier's outcome for "refused before
//	                                    acceptance, retry" is HTTP_5XX (SMTP has no separate
//	                                    throttling reply, so THROTTLED is not used)
//	5yz at any step (535 AUTH,        REJECTED
//	  550 recipient, 554 greeting)
//	no connection, no greeting,       CONNECT_FAILED: certainly not accepted, retried
//	  STARTTLS missing (required) or
//	  unverifiable, broken connection
//	  or timeout before the final "."
//	timeout after the final "."       TIMEOUT: outcome unknown
//	broken connection after it        IO_ERROR: outcome unknown
//	unreadable reply after it         MALFORMED_RESPONSE: outcome unknown
package smtpchannel

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/textproto"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// TLSMode says whether and how STARTTLS is used.
type TLSMode string

const (
	// TLSRequired: the relay must offer STARTTLS and present a certificate valid for its host name;
	// otherwise nothing is sent (CONNECT_FAILED).
	TLSRequired TLSMode = "required"
	// TLSOpportunistic: STARTTLS (with verification) when offered, plain text otherwise. AUTH is
	// refused over plain text except to a loopback relay.
	TLSOpportunistic TLSMode = "opportunistic"
	// TLSNone: never STARTTLS (a relay on localhost or a trusted socket).
	TLSNone TLSMode = "none"
)

// ParseTLSMode accepts required, opportunistic or none; "" is required.
func ParseTLSMode(s string) (TLSMode, error) {
	switch m := TLSMode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return TLSRequired, nil
	case TLSRequired, TLSOpportunistic, TLSNone:
		return m, nil
	}
	return "", fmt.Errorf("%w: starttls %q: want required, opportunistic or none", delivery.ErrInvalidInput, s)
}

// Options configure a client.
type Options struct {
	Addr            string  // relay host:port
	StartTLS        TLSMode // default required
	CAFile          string  // extra PEM roots for the relay's certificate
	Username        string  // AUTH PLAIN user; empty: no AUTH
	Password        string  // AUTH PLAIN password; never logged or shown in errors
	From            string  // envelope and header sender, e.g. "Notifier <noreply@example.com>"
	HeloName        string  // EHLO name; default: the host name
	MessageIDDomain string  // right-hand side of Message-ID; default: the From address's domain
	SubjectPrefix   string  // prepended to the body's first line, e.g. "[Shop] "
	Now             func() time.Time
}

// Client sends mail through one relay. Safe for concurrent use: each Send has its own connection.
type Client struct {
	addr, host   string
	mode         TLSMode
	tls          *tls.Config
	user, pass   string
	from         *mail.Address
	helo         string
	msgIDDomain  string
	subjectPrefx string
	now          func() time.Time
}

// New checks the options. Errors never contain the password.
func New(opt Options) (*Client, error) {
	host, port, err := net.SplitHostPort(opt.Addr)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("%w: SMTP relay address %q: want host:port", delivery.ErrInvalidInput, opt.Addr)
	}
	mode, err := ParseTLSMode(string(opt.StartTLS))
	if err != nil {
		return nil, err
	}
	from, err := mail.ParseAddress(opt.From)
	if err != nil || !strings.Contains(from.Address, "@") {
		return nil, fmt.Errorf("%w: from address %q: want an email address", delivery.ErrInvalidInput, opt.From)
	}
	if (opt.Username == "") != (opt.Password == "") {
		return nil, fmt.Errorf("%w: SMTP AUTH needs both a username and a password", delivery.ErrInvalidInput)
	}
	if strings.ContainsAny(opt.Username, "\x00\r\n") || strings.ContainsAny(opt.Password, "\x00\r\n") {
		return nil, fmt.Errorf("%w: SMTP credentials contain NUL, CR or LF", delivery.ErrInvalidInput)
	}
	if opt.Username != "" && mode == TLSNone && !httpkit.IsLoopbackHost(host) {
		return nil, fmt.Errorf("%w: SMTP AUTH with starttls = none to %s would send the password in clear text", delivery.ErrInvalidInput, host)
	}
	helo := opt.HeloName
	if helo == "" {
		if helo, err = os.Hostname(); err != nil || helo == "" {
			helo = "localhost"
		}
	}
	if strings.ContainsAny(helo, " \t\r\n<>") {
		return nil, fmt.Errorf("%w: HELO name %q", delivery.ErrInvalidInput, helo)
	}
	domain := opt.MessageIDDomain
	if domain == "" {
		domain = from.Address[strings.LastIndexByte(from.Address, '@')+1:]
	}
	if !isDotAtom(domain) {
		return nil, fmt.Errorf("%w: Message-ID domain %q", delivery.ErrInvalidInput, domain)
	}
	if strings.ContainsAny(opt.SubjectPrefix, "\r\n") {
		return nil, fmt.Errorf("%w: subject prefix contains a line break", delivery.ErrInvalidInput)
	}
	tlsConf, err := httpkit.TLSConfig(opt.CAFile, host)
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{addr: opt.Addr, host: host, mode: mode, tls: tlsConf, user: opt.Username, pass: opt.Password,
		from: from, helo: helo, msgIDDomain: domain, subjectPrefx: opt.SubjectPrefix, now: now}, nil
}

// String is the relay for logs.
func (c *Client) String() string { return "smtp://" + c.addr }

// MessageID is the Message-ID header of every copy of the message with this idempotency key.
func (c *Client) MessageID(idempotencyKey string) string {
	return "<" + idempotencyKey + "@" + c.msgIDDomain + ">"
}

// Query is not offered: a relay cannot be asked what it accepted.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}

// Send delivers msg.Body to msg.To. Every network step is bounded by ctx. See the package comment
// for the mapping of replies and failures.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	to, err := mail.ParseAddress(msg.To)
	if err != nil || !strings.Contains(to.Address, "@") {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "recipient is not an email address"}
	}
	if !isDotAtom(msg.IdempotencyKey) {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "idempotency key unusable in a Message-ID"}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "connect: " + errText(err)}
	}
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(httpkit.BackstopTimeout) // callers pass the real timeout; this only bounds a caller that forgot
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	s := &session{c: c, ctx: ctx, raw: conn, tp: textproto.NewConn(conn)}
	return s.run(msg, to)
}

// writeMessage writes the message text to w: headers, a blank line, the body as quoted-printable
// UTF-8 text (streamed, so a large body is bounded by the context like any other write).
func (c *Client) writeMessage(w io.Writer, msg delivery.Message, to *mail.Address) error {
	body := strings.ReplaceAll(strings.ReplaceAll(msg.Body, "\r\n", "\n"), "\r", "\n")
	var b strings.Builder
	header := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	header("From", c.from.String())
	header("To", to.String())
	header("Subject", mime.QEncoding.Encode("utf-8", delivery.Subject(c.subjectPrefx, msg.Body)))
	header("Date", c.now().Format(time.RFC1123Z))
	header("Message-ID", c.MessageID(msg.IdempotencyKey))
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "quoted-printable")
	header("Auto-Submitted", "auto-generated") // RFC 3834: no auto-replies
	b.WriteString("\r\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	qp := quotedprintable.NewWriter(w)
	if _, err := io.WriteString(qp, strings.ToValidUTF8(body, "\uFFFD")); err != nil {
		return err
	}
	return qp.Close()
}

// session is one SMTP conversation.
type session struct {
	c       *Client
	ctx     context.Context
	raw     net.Conn
	tp      *textproto.Conn
	ext     map[string]string // EHLO keywords (upper case) -> parameters
	secured bool
}

// before is a failure before the end-of-data indication: certainly not accepted.
func (s *session) before(step string, err error) delivery.Observation {
	what := "connection lost"
	if s.ctx.Err() != nil || httpkit.IsTimeout(err) {
		what = "timeout"
	}
	return delivery.Observation{Outcome: delivery.OutcomeConnectFailed,
		Detail: fmt.Sprintf("%s at %s, before the end of data (not accepted): %s", what, step, errText(err))}
}

// replyObservation maps a negative or unexpected reply at step: 4yz temporary, 5yz permanent.
func replyObservation(step string, code int, text string) delivery.Observation {
	detail := fmt.Sprintf("SMTP %d %s (at %s)", code, clean(text), step)
	switch code / 100 {
	case 4:
		return delivery.Observation{Outcome: delivery.OutcomeHTTP5xx, Detail: detail}
	case 5:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: detail}
	}
	return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "unexpected " + detail}
}

// cmd sends one command line and reads its reply; obs is set unless the reply is in the class want
// (2 for 2yz, 3 for 3yz).
func (s *session) cmd(step string, want int, format string, args ...any) (code int, text string, obs *delivery.Observation) {
	if err := s.tp.PrintfLine(format, args...); err != nil {
		o := s.before(step, err)
		return 0, "", &o
	}
	return s.reply(step, want)
}

func (s *session) reply(step string, want int) (int, string, *delivery.Observation) {
	code, text, err := s.tp.ReadResponse(0)
	if err != nil {
		var perr textproto.ProtocolError
		if errors.As(err, &perr) {
			o := delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: fmt.Sprintf("not an SMTP reply at %s, before the end of data (not accepted)", step)}
			return 0, "", &o
		}
		o := s.before(step, err)
		return 0, "", &o
	}
	if code/100 != want {
		o := replyObservation(step, code, text)
		return code, text, &o
	}
	return code, text, nil
}

func (s *session) run(msg delivery.Message, to *mail.Address) delivery.Observation {
	rcpt, messageID := to.Address, s.c.MessageID(msg.IdempotencyKey)
	// The greeting: no reply at all means no session was ever opened.
	if _, _, obs := s.reply("greeting", 2); obs != nil {
		if obs.Outcome == delivery.OutcomeConnectFailed {
			obs.Detail = strings.Replace(obs.Detail, "at greeting", "before the server greeting", 1)
		}
		return *obs
	}
	if obs := s.hello(); obs != nil {
		return s.quit(*obs)
	}
	if obs := s.startTLS(); obs != nil {
		return s.quit(*obs)
	}
	if obs := s.auth(); obs != nil {
		return s.quit(*obs)
	}
	params := ""
	if !isASCII(s.c.from.Address) || !isASCII(rcpt) {
		if _, ok := s.ext["SMTPUTF8"]; !ok {
			return s.quit(delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "non-ASCII address and the relay does not offer SMTPUTF8"})
		}
		params = " SMTPUTF8"
	}
	if _, _, obs := s.cmd("MAIL", 2, "MAIL FROM:<%s>%s", s.c.from.Address, params); obs != nil {
		return s.quit(*obs)
	}
	if _, _, obs := s.cmd("RCPT", 2, "RCPT TO:<%s>", rcpt); obs != nil {
		return s.quit(*obs)
	}
	if _, _, obs := s.cmd("DATA", 3, "DATA"); obs != nil {
		return s.quit(*obs)
	}
	// The message text, dot-stuffed. Until the final "." line is written the relay has an
	// incomplete transaction only: a failure here is still "not accepted".
	dw := s.tp.DotWriter()
	if err := s.c.writeMessage(dw, msg, to); err != nil {
		return s.before("message text", err)
	}
	if err := s.tp.W.Flush(); err != nil {
		return s.before("message text", err)
	}
	// From here on the outcome is unknown until the reply is read.
	if err := dw.Close(); err != nil {
		return s.after(err)
	}
	code, reply, err := s.tp.ReadResponse(0)
	if err != nil {
		var perr textproto.ProtocolError
		if errors.As(err, &perr) {
			return delivery.Observation{Outcome: delivery.OutcomeMalformed, Detail: "unreadable reply to the end of data: outcome unknown"}
		}
		return s.after(err)
	}
	switch code / 100 {
	case 2:
		return s.quit(delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: messageID})
	case 4, 5:
		return s.quit(replyObservation("end of data", code, reply))
	}
	return delivery.Observation{Outcome: delivery.OutcomeMalformed, Detail: fmt.Sprintf("unexpected SMTP %d to the end of data: outcome unknown", code)}
}

// after is a failure once the final "." may have reached the relay: the outcome is unknown.
func (s *session) after(err error) delivery.Observation {
	if s.ctx.Err() != nil || httpkit.IsTimeout(err) {
		return delivery.Observation{Outcome: delivery.OutcomeTimeout, Detail: "no reply to the end of data within the client timeout: outcome unknown"}
	}
	return delivery.Observation{Outcome: delivery.OutcomeIOError, Detail: "connection lost after the end of data: outcome unknown: " + errText(err)}
}

// quit ends the session politely (best effort, within a second) and returns obs unchanged.
func (s *session) quit(obs delivery.Observation) delivery.Observation {
	if s.ctx.Err() == nil {
		d := time.Now().Add(time.Second)
		if deadline, ok := s.ctx.Deadline(); ok && deadline.Before(d) {
			d = deadline
		}
		_ = s.raw.SetDeadline(d)
		if s.tp.PrintfLine("QUIT") == nil {
			_, _, _ = s.tp.ReadResponse(0)
		}
	}
	return obs
}

// hello sends EHLO (HELO if the relay does not know EHLO) and records the extensions.
func (s *session) hello() *delivery.Observation {
	if err := s.tp.PrintfLine("EHLO %s", s.c.helo); err != nil {
		o := s.before("EHLO", err)
		return &o
	}
	code, text, obs := s.reply("EHLO", 2)
	if obs != nil && code >= 500 && code <= 502 {
		s.ext = map[string]string{}
		_, _, obs = s.cmd("HELO", 2, "HELO %s", s.c.helo)
		return obs
	}
	if obs != nil {
		return obs
	}
	s.ext = map[string]string{}
	lines := strings.Split(text, "\n")
	for _, l := range lines[1:] { // the first line is the greeting
		k, v, _ := strings.Cut(strings.TrimSpace(l), " ")
		s.ext[strings.ToUpper(k)] = v
	}
	return nil
}

func (s *session) startTLS() *delivery.Observation {
	if s.c.mode == TLSNone {
		return nil
	}
	if _, ok := s.ext["STARTTLS"]; !ok {
		if s.c.mode == TLSRequired {
			return &delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "the relay does not offer STARTTLS (starttls = required): not sent"}
		}
		return nil
	}
	if _, _, obs := s.cmd("STARTTLS", 2, "STARTTLS"); obs != nil {
		return obs
	}
	tc := tls.Client(s.raw, s.c.tls)
	if err := tc.HandshakeContext(s.ctx); err != nil {
		return &delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "STARTTLS handshake (not sent): " + errText(err)}
	}
	s.raw, s.tp, s.secured = tc, textproto.NewConn(tc), true
	return s.hello()
}

func (s *session) auth() *delivery.Observation {
	if s.c.user == "" {
		return nil
	}
	if !s.secured && !httpkit.IsLoopbackHost(s.c.host) {
		return &delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "the relay offered no STARTTLS: AUTH refused over plain text (not sent)"}
	}
	mechs, ok := s.ext["AUTH"]
	if !ok || !containsFold(strings.Fields(mechs), "PLAIN") {
		return &delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "the relay does not offer AUTH PLAIN (not sent)"}
	}
	resp := base64.StdEncoding.EncodeToString([]byte("\x00" + s.c.user + "\x00" + s.c.pass))
	if err := s.tp.PrintfLine("AUTH PLAIN %s", resp); err != nil {
		o := s.before("AUTH", err)
		return &o
	}
	_, _, obs := s.reply("AUTH", 2)
	return obs
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// isDotAtom reports whether s is an RFC 5322 dot-atom (safe inside a Message-ID).
func isDotAtom(s string) bool {
	if s == "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-/=?^_`{|}~.", r)) {
			return false
		}
	}
	return true
}

// errText is an error's text on one line.
func errText(err error) string {
	if errors.Is(err, io.EOF) {
		return "connection closed by the relay"
	}
	return clean(err.Error())
}

// clean makes a relay's reply or an error fit one short line.
func clean(s string) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "?")), " ")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
