// Package receipts is notifier's receiver of provider receipts (notifier receipts): an HTTP handler
// that accepts delivery callbacks only when signed, turns each into a service.Receipt and records it.
// Three formats:
//
//	POST /receipts/standard-webhooks  Standard Webhooks (HMAC-SHA256 over "id.timestamp.body", webhook-id,
//	                                  webhook-timestamp within a tolerance, webhook-signature "v1,<b64>");
//	                                  notifier's event types, data.ref = our reference
//	POST /receipts/twilio             Twilio status callbacks (X-Twilio-Signature: HMAC-SHA1 over the URL
//	                                  and the sorted form parameters, base64); ?ref= in the callback URL
//	POST /receipts/postmark           Postmark's Delivery, Bounce and SpamComplaint webhooks, which are not
//	                                  signed: basic authentication and/or a secret custom header instead
//	                                  (postmark.go); Metadata.notifier_ref = our reference
//	POST /receipts/ses                Amazon SES events through Amazon SNS (ses.go): SNS's RSA signature
//	                                  (SignatureVersion 1 or 2) by a certificate fetched from an SNS host,
//	                                  a configured TopicArn; mail.tags.notifier_ref = our reference
//
// A bad signature, a stale timestamp, an oversized or malformed body, an unknown event type or a reference
// no task has is answered 4xx and nothing is written. What verification proves and what it cannot is in
// docs/channels.md#receipts.
package receipts

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

// MaxBodyBytes bounds a callback's body: a receipt is small; a larger body is refused (413) unread.
const MaxBodyBytes = 64 << 10

// DefaultTolerance is how far a Standard Webhooks timestamp may be from the receiver's clock (the
// specification's suggestion): an older message is refused as a possible replay.
const DefaultTolerance = 5 * time.Minute

// Recorder records a verified receipt: *service.Notifier.
type Recorder interface {
	RecordReceipt(ctx context.Context, r delivery.Receipt, disableOnBounce bool) (delivery.ReceiptResult, error)
}

// Config of the handler. A format without its secret is not served (404).
type Config struct {
	// WebhookKeys are the Standard Webhooks signing keys (webhook.ParseSecret of each whsec_ secret);
	// several during a rotation: a signature by any of them is accepted.
	WebhookKeys [][]byte
	// TwilioAuthToken signs Twilio's callbacks.
	TwilioAuthToken string
	// Postmark are the credentials Postmark's webhooks must present (Postmark signs nothing).
	Postmark PostmarkAuth
	// SES enables Amazon SES events through SNS (its topics).
	SES SESConfig
	// PublicURL is the scheme and host Twilio calls (behind a proxy the receiver does not see them):
	// the signature covers the full URL.
	PublicURL *url.URL
	// Tolerance for Standard Webhooks timestamps; DefaultTolerance when zero.
	Tolerance time.Duration
	// DisableOnBounce switches the user's preference off after a hard bounce.
	DisableOnBounce bool
	// RecordTimeout bounds recording one receipt (the database); 10 s when zero.
	RecordTimeout time.Duration
	Now           func() time.Time
	Logger        *slog.Logger
	// OnResult counts every callback by source and result (settled, noted, unchanged, contradicts,
	// duplicate, or why it was refused).
	OnResult func(source, result string)
}

// Handler serves the receipt endpoints.
type Handler struct {
	rec   Recorder
	cfg   Config
	mux   *http.ServeMux
	certs certCache // SNS signing certificates by URL
}

// NewHandler builds the handler.
func NewHandler(rec Recorder, cfg Config) *Handler {
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.RecordTimeout <= 0 {
		cfg.RecordTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SES.FetchTimeout <= 0 {
		cfg.SES.FetchTimeout = DefaultFetchTimeout
	}
	if cfg.SES.Fetch == nil {
		cfg.SES.Fetch, _ = HTTPFetch(FetchOptions{}) // fails only on a CA file, and there is none
	}
	h := &Handler{rec: rec, cfg: cfg, mux: http.NewServeMux()}
	if len(cfg.WebhookKeys) > 0 {
		h.mux.HandleFunc("POST /receipts/standard-webhooks", h.standardWebhooks)
	}
	if cfg.TwilioAuthToken != "" {
		h.mux.HandleFunc("POST /receipts/twilio", h.twilio)
	}
	if cfg.Postmark.Enabled() {
		h.mux.HandleFunc("POST /receipts/postmark", h.postmark)
	}
	if cfg.SES.Enabled() {
		h.mux.HandleFunc("POST /receipts/ses", h.ses)
	}
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// refusal is a callback answered 4xx: nothing was written.
type refusal struct {
	status int
	result string // for OnResult: bad_signature, stale, too_large, malformed, unknown_type, ...
	msg    string
}

func (e *refusal) Error() string { return e.msg }

func refuse(status int, result, format string, args ...any) *refusal {
	return &refusal{status: status, result: result, msg: fmt.Sprintf(format, args...)}
}

// readBody reads at most MaxBodyBytes; more is a refusal.
func readBody(r *http.Request) ([]byte, error) { return readBodyLimit(r, MaxBodyBytes) }

// readBodyLimit reads at most limit bytes; more is a refusal.
func readBodyLimit(r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "malformed", "read body: %v", err)
	}
	if int64(len(body)) > limit {
		return nil, refuse(http.StatusRequestEntityTooLarge, "too_large", "body over %d bytes", limit)
	}
	return body, nil
}

// standardWebhooks verifies and records one Standard Webhooks callback.
func (h *Handler) standardWebhooks(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, delivery.ReceiptSourceStandardWebhooks, func() (delivery.Receipt, error) {
		body, err := readBody(r)
		if err != nil {
			return delivery.Receipt{}, err
		}
		id, ts, err := VerifyStandardWebhook(h.cfg.WebhookKeys, r.Header, body, h.cfg.Now(), h.cfg.Tolerance)
		if err != nil {
			return delivery.Receipt{}, err
		}
		rec, err := ParseStandardWebhook(body)
		if err != nil {
			return delivery.Receipt{}, err
		}
		rec.EventID = id
		if rec.OccurredAt.IsZero() {
			rec.OccurredAt = ts
		}
		return rec, nil
	})
}

// twilio verifies and records one Twilio status callback.
func (h *Handler) twilio(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, delivery.ReceiptSourceTwilio, func() (delivery.Receipt, error) {
		body, err := readBody(r)
		if err != nil {
			return delivery.Receipt{}, err
		}
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "form body: %v", err)
		}
		if !VerifyTwilio(h.cfg.TwilioAuthToken, h.publicURL(r), form, r.Header.Get("X-Twilio-Signature")) {
			return delivery.Receipt{}, refuse(http.StatusUnauthorized, "bad_signature", "X-Twilio-Signature does not match")
		}
		return ParseTwilio(form, r.URL.Query().Get("ref"))
	})
}

// publicURL is the URL Twilio called, as it signed it.
func (h *Handler) publicURL(r *http.Request) string {
	base := h.cfg.PublicURL
	if base == nil {
		base = &url.URL{Scheme: "http", Host: r.Host}
	}
	return strings.TrimSuffix(base.Scheme+"://"+base.Host+base.Path, "/") + r.URL.RequestURI()
}

// serve runs parse (verification included) and records the receipt, answering and counting the result.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, source string, parse func() (delivery.Receipt, error)) {
	rec, err := parse()
	if err == nil {
		var res delivery.ReceiptResult
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.RecordTimeout)
		res, err = h.rec.RecordReceipt(ctx, rec, h.cfg.DisableOnBounce)
		cancel()
		if err == nil {
			result := strings.ToLower(string(res.Effect))
			if res.Duplicate {
				result = "duplicate"
			}
			h.count(source, result)
			h.cfg.Logger.Info("RECEIPT", "source", source, "event", rec.EventID, "kind", rec.Kind, "task", res.TaskID,
				"result", result, "state", res.State, "pref_disabled", res.PrefDisabled)
			writeJSON(w, http.StatusOK, map[string]any{"result": result, "task_id": res.TaskID, "state": res.State})
			return
		}
	}
	h.fail(w, source, err)
}

// fail answers and counts a callback that was refused or could not be recorded.
func (h *Handler) fail(w http.ResponseWriter, source string, err error) {
	var ref *refusal
	switch {
	case errors.As(err, &ref):
	case errors.Is(err, delivery.ErrUnknownReference):
		ref = refuse(http.StatusNotFound, "unknown_reference", "%v", err)
	case errors.Is(err, delivery.ErrAmbiguousReference):
		ref = refuse(http.StatusConflict, "ambiguous_reference", "%v", err)
	case errors.Is(err, delivery.ErrInvalidInput):
		ref = refuse(http.StatusBadRequest, "malformed", "%v", err)
	default:
		// The database failed: the provider retries a 5xx, and the receipt is recorded then.
		h.count(source, "error")
		h.cfg.Logger.Error("receipt not recorded; the provider will retry", "source", source, "error", err)
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "receipt not recorded, retry later"})
		return
	}
	h.count(source, ref.result)
	h.cfg.Logger.Warn("receipt refused", "source", source, "status", ref.status, "result", ref.result, "error", ref.msg)
	writeJSON(w, ref.status, map[string]string{"error": ref.msg})
}

func (h *Handler) count(source, result string) {
	if h.cfg.OnResult != nil {
		h.cfg.OnResult(source, result)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// VerifyStandardWebhook checks a Standard Webhooks signature: webhook-id, webhook-timestamp (within
// tolerance of now: an old message may be a replay) and webhook-signature, a space-separated list of
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>", any of which may match any key. It returns the
// message id (the event id receipts are deduplicated by) and the timestamp.
func VerifyStandardWebhook(keys [][]byte, header http.Header, body []byte, now time.Time, tolerance time.Duration) (string, time.Time, error) {
	id, tsText, sigs := standardHeaders(header)
	if id == "" || tsText == "" || sigs == "" {
		return "", time.Time{}, refuse(http.StatusUnauthorized, "bad_signature", "missing webhook-id, webhook-timestamp or webhook-signature (or svix-id, svix-timestamp, svix-signature)")
	}
	secs, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return "", time.Time{}, refuse(http.StatusUnauthorized, "bad_signature", "webhook-timestamp %q is not a number of seconds", tsText)
	}
	ts := time.Unix(secs, 0)
	if d := now.Sub(ts); d > tolerance || d < -tolerance {
		return "", time.Time{}, refuse(http.StatusUnauthorized, "stale", "webhook-timestamp is %s away from now, more than the %s tolerance", d.Round(time.Second), tolerance)
	}
	for _, key := range keys {
		want := signV1(key, id, tsText, body)
		for _, sig := range strings.Fields(sigs) {
			version, value, ok := strings.Cut(sig, ",")
			if ok && version == "v1" && subtle.ConstantTimeCompare([]byte(value), []byte(want)) == 1 {
				return id, ts, nil
			}
		}
	}
	return "", time.Time{}, refuse(http.StatusUnauthorized, "bad_signature", "webhook-signature does not match")
}

// standardHeaders reads a Standard Webhooks request's id, timestamp and signatures: the specification's
// webhook-* headers or, when a request has none of them, Svix's svix-* headers. Svix (which signs
// Resend's webhooks: https://resend.com/docs/dashboard/webhooks/verify-webhooks-requests) uses the same
// algorithm and whsec_ secrets under those names (https://docs.svix.com/receiving/verifying-payloads/how-manual).
// Never a mix: a request that sets any webhook-* header is read by those names only.
func standardHeaders(h http.Header) (id, ts, sigs string) {
	id, ts, sigs = h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" && ts == "" && sigs == "" {
		id, ts, sigs = h.Get("svix-id"), h.Get("svix-timestamp"), h.Get("svix-signature")
	}
	return id, ts, sigs
}

func signV1(key []byte, id, ts string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// standardEvent is notifier's receipt payload in the Standard Webhooks envelope.
type standardEvent struct {
	Type      string `json:"type"`
	Timestamp string `json:"timestamp"`
	Data      struct {
		Ref           string `json:"ref"`             // the task's ref, or ntf-<ref>
		ProviderMsgID string `json:"provider_msg_id"` // when no ref
		Bounce        string `json:"bounce"`          // message.bounced: hard or soft
		Detail        string `json:"detail"`
	} `json:"data"`
}

// standardKinds maps notifier's event types to receipt kinds.
var standardKinds = map[string]delivery.ReceiptKind{
	"message.accepted":    delivery.ReceiptAccepted,
	"message.sent":        delivery.ReceiptAccepted,
	"message.delivered":   delivery.ReceiptDelivered,
	"message.bounced":     delivery.ReceiptBounced,
	"message.complained":  delivery.ReceiptComplained,
	"message.undelivered": delivery.ReceiptUndelivered,
}

// ParseStandardWebhook reads a verified Standard Webhooks body: {"type": "message.delivered",
// "timestamp": RFC 3339, "data": {"ref": "ntf-<ref>", "provider_msg_id": ..., "bounce": "hard"}}.
// A Resend event (type email.*) is read as Resend documents it (ParseResend).
func ParseStandardWebhook(body []byte) (delivery.Receipt, error) {
	var ev standardEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "body is not a JSON event: %v", err)
	}
	if strings.HasPrefix(ev.Type, "email.") {
		return ParseResend(body)
	}
	kind, ok := standardKinds[ev.Type]
	if !ok {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "unknown_type", "event type %q is not a receipt (want message.accepted, .sent, .delivered, .bounced, .complained or .undelivered, or Resend's email.*)", ev.Type)
	}
	rec := delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, Kind: kind,
		ProviderMsgID: ev.Data.ProviderMsgID, Detail: ev.Data.Detail}
	if ev.Data.Ref != "" {
		ref, ok := delivery.ParseRef(ev.Data.Ref)
		if !ok {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "data.ref %q is not a reference of ours (the task's ref or ntf-<ref>)", ev.Data.Ref)
		}
		rec.Ref = ref
	}
	switch {
	case kind != delivery.ReceiptBounced && ev.Data.Bounce != "":
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "data.bounce on a %s event", ev.Type)
	case ev.Data.Bounce == "hard":
		rec.HardBounce = true
	case ev.Data.Bounce != "" && ev.Data.Bounce != "soft":
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "data.bounce %q: want hard or soft", ev.Data.Bounce)
	}
	if ev.Timestamp != "" {
		at, err := time.Parse(time.RFC3339, ev.Timestamp)
		if err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "timestamp %q is not RFC 3339", ev.Timestamp)
		}
		rec.OccurredAt = at
	}
	return rec, nil
}

// VerifyTwilio checks X-Twilio-Signature: base64 of HMAC-SHA1, keyed with the auth token, over the full
// URL Twilio called followed by the form parameters (TwilioSignature). Like Twilio's own libraries it
// also accepts the URL with the default port added or removed (proxies differ).
func VerifyTwilio(authToken, fullURL string, form url.Values, signature string) bool {
	if authToken == "" || signature == "" {
		return false
	}
	for _, u := range urlVariants(fullURL) {
		if subtle.ConstantTimeCompare([]byte(TwilioSignature(authToken, u, form)), []byte(signature)) == 1 {
			return true
		}
	}
	return false
}

// TwilioSignature is the X-Twilio-Signature Twilio sends for a callback to fullURL with form
// (https://www.twilio.com/docs/usage/webhooks/webhooks-security): the URL, then the parameters sorted
// by name, each appended as name+value without delimiters. A name that is repeated appends each of its
// distinct values in sorted order, as Twilio's validators do (twilio-node's toFormUrlEncodedParam,
// https://github.com/twilio/twilio-node/blob/main/src/webhooks/webhooks.ts, and twilio-python's
// compute_signature): the order in which the values arrived does not count, and a duplicate value once.
func TwilioSignature(authToken, fullURL string, form url.Values) string {
	names := make([]string, 0, len(form))
	for name := range form {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(fullURL)
	for _, name := range names {
		values := slices.Clone(form[name])
		slices.Sort(values)
		for _, v := range slices.Compact(values) {
			b.WriteString(name)
			b.WriteString(v)
		}
	}
	mac := hmac.New(sha1.New, []byte(authToken))
	mac.Write([]byte(b.String()))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// urlVariants is fullURL as given, and with its scheme's default port added or removed.
func urlVariants(fullURL string) []string {
	u, err := url.Parse(fullURL)
	if err != nil {
		return []string{fullURL}
	}
	port := map[string]string{"https": "443", "http": "80"}[u.Scheme]
	other := *u
	switch {
	case port == "":
		return []string{fullURL}
	case u.Port() == "":
		other.Host = u.Host + ":" + port
	case u.Port() == port:
		other.Host = u.Hostname()
	default:
		return []string{fullURL}
	}
	return []string{fullURL, other.String()}
}

// twilioHardBounces are Twilio error codes after which the number will not take messages: unknown
// destination handset (30005), landline or unreachable carrier (30006).
var twilioHardBounces = map[string]bool{"30005": true, "30006": true}

// ParseTwilio reads a verified Twilio status callback: MessageSid, MessageStatus (queued, sending, sent,
// accepted, scheduled, partially_delivered: ACCEPTED; delivered, read: DELIVERED; undelivered, failed, canceled: UNDELIVERED,
// or BOUNCED hard for the error codes of a number that does not exist), ErrorCode. ref is the ?ref= of
// the callback URL, when the bridge that sent the message set it. The event id is the message sid and
// its status: Twilio repeats a callback it could not deliver, and it is recorded once.
func ParseTwilio(form url.Values, ref string) (delivery.Receipt, error) {
	sid, status := form.Get("MessageSid"), strings.ToLower(form.Get("MessageStatus"))
	if sid == "" || status == "" {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "missing MessageSid or MessageStatus")
	}
	rec := delivery.Receipt{Source: delivery.ReceiptSourceTwilio, EventID: sid + ":" + status, ProviderMsgID: sid}
	switch status {
	case "queued", "sending", "sent", "accepted", "scheduled":
		rec.Kind = delivery.ReceiptAccepted
	case "partially_delivered":
		// Twilio lists it among an outbound message's statuses
		// (https://www.twilio.com/docs/messaging/api/message-resource#message-status-values): only a
		// message Twilio accepted gets that far. Part of it reached the handset, so it is neither
		// undelivered (nothing may be written off) nor proof that the user saw all of it.
		rec.Kind = delivery.ReceiptAccepted
	case "delivered", "read":
		rec.Kind = delivery.ReceiptDelivered
	case "undelivered", "failed", "canceled":
		rec.Kind = delivery.ReceiptUndelivered
		if code := form.Get("ErrorCode"); twilioHardBounces[code] {
			rec.Kind, rec.HardBounce = delivery.ReceiptBounced, true
		}
	default:
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "unknown_type", "MessageStatus %q is not a receipt", status)
	}
	if code := form.Get("ErrorCode"); code != "" {
		rec.Detail = "Twilio " + status + ", error " + code
	}
	if ref != "" {
		ours, ok := delivery.ParseRef(ref)
		if !ok {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "ref %q is not a reference of ours (the task's ref or ntf-<ref>)", ref)
		}
		rec.Ref = ours
	}
	return rec, nil
}
