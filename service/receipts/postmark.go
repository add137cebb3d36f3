package receipts

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

// PostmarkAuth is how Postmark's webhooks prove they are Postmark's. Postmark signs nothing: a webhook
// is protected by basic HTTP authentication, the credentials written into the webhook URL
// (https://user:password@host/receipts/postmark), and by custom HTTP headers set on the webhook
// (https://postmarkapp.com/developer/webhooks/webhooks-overview,
// https://postmarkapp.com/developer/api/webhooks-api: HttpAuth, HttpHeaders). Configure either or
// both; every one configured must match. Neither configured: the endpoint is not served.
type PostmarkAuth struct {
	Username, Password  string // basic authentication (both, or neither)
	Header, HeaderValue string // a custom header's name and secret value (both, or neither)
}

// Enabled reports whether any credential is configured.
func (a PostmarkAuth) Enabled() bool { return a.Password != "" || a.HeaderValue != "" }

// PostmarkRefMetadata is the metadata field our emails carry the task's ref in (service/postmark).
const PostmarkRefMetadata = "notifier_ref"

// VerifyPostmark checks a webhook request against the configured credentials, in constant time.
func VerifyPostmark(auth PostmarkAuth, r *http.Request) error {
	if !auth.Enabled() {
		return refuse(http.StatusUnauthorized, "bad_signature", "no Postmark webhook credentials configured")
	}
	if auth.Password != "" {
		user, password, ok := r.BasicAuth()
		if !ok {
			return refuse(http.StatusUnauthorized, "bad_signature", "no basic authentication (put the credentials into the webhook URL)")
		}
		userOK := subtle.ConstantTimeCompare([]byte(user), []byte(auth.Username)) == 1
		passOK := subtle.ConstantTimeCompare([]byte(password), []byte(auth.Password)) == 1
		if !userOK || !passOK {
			return refuse(http.StatusUnauthorized, "bad_signature", "basic authentication does not match")
		}
	}
	if auth.HeaderValue != "" {
		got := r.Header.Get(auth.Header)
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(auth.HeaderValue)) != 1 {
			return refuse(http.StatusUnauthorized, "bad_signature", "header %s missing or does not match", auth.Header)
		}
	}
	return nil
}

// postmark verifies and records one Postmark webhook.
func (h *Handler) postmark(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, delivery.ReceiptSourcePostmark, func() (delivery.Receipt, error) {
		if err := VerifyPostmark(h.cfg.Postmark, r); err != nil {
			return delivery.Receipt{}, err
		}
		body, err := readBody(r)
		if err != nil {
			return delivery.Receipt{}, err
		}
		return ParsePostmark(body)
	})
}

// postmarkEvent is the part of Postmark's Delivery, Bounce and SpamComplaint webhooks receipts read
// (https://postmarkapp.com/developer/webhooks/delivery-webhook, .../bounce-webhook,
// .../spam-complaint-webhook).
type postmarkEvent struct {
	RecordType  string            `json:"RecordType"`
	ID          json.Number       `json:"ID"` // the bounce's id (Bounce, SpamComplaint)
	Type        string            `json:"Type"`
	MessageID   string            `json:"MessageID"`
	Recipient   string            `json:"Recipient"` // Delivery
	Email       string            `json:"Email"`     // Bounce, SpamComplaint
	Description string            `json:"Description"`
	Details     string            `json:"Details"`
	DeliveredAt string            `json:"DeliveredAt"`
	BouncedAt   string            `json:"BouncedAt"`
	Metadata    map[string]string `json:"Metadata"`
	// Inactive: Postmark deactivated the address after this bounce and sends it nothing more until it
	// is reactivated (https://postmarkapp.com/developer/webhooks/bounce-webhook,
	// https://postmarkapp.com/developer/api/bounce-api: "Inactive", "CanActivate").
	Inactive bool `json:"Inactive"`
}

// ParsePostmark reads a verified Postmark webhook body. Delivery -> DELIVERED; Bounce -> BOUNCED, hard
// (the address is gone: `receipts --disable-on-bounce` switches the preference off, as FCM's
// UNREGISTERED does with `work --disable-on-unregistered`) exactly when the payload says Inactive:
// Postmark's own verdict that it will not send to the address again, whatever the bounce's type (a
// HardBounce Postmark keeps active is not; repeated soft bounces it deactivated are);
// SpamComplaint -> COMPLAINED; any other RecordType (Open, Click,
// SubscriptionChange) is refused as no receipt. The ref is Metadata.notifier_ref; the MessageID is
// matched when there is none. The event id: the bounce's ID for Bounce and SpamComplaint, the
// MessageID and recipient for Delivery (Postmark retries a webhook that failed; each is recorded once).
func ParsePostmark(body []byte) (delivery.Receipt, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var ev postmarkEvent
	if err := dec.Decode(&ev); err != nil {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "body is not a Postmark webhook: %v", err)
	}
	rec := delivery.Receipt{Source: delivery.ReceiptSourcePostmark, ProviderMsgID: ev.MessageID}
	at := ev.BouncedAt
	switch ev.RecordType {
	case "Delivery":
		rec.Kind, at = delivery.ReceiptDelivered, ev.DeliveredAt
		if ev.MessageID == "" {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "Delivery without a MessageID")
		}
		rec.EventID = "Delivery:" + ev.MessageID + ":" + ev.Recipient
		rec.Detail = "Postmark delivery to " + ev.Recipient
	case "Bounce", "SpamComplaint":
		if _, err := strconv.ParseInt(ev.ID.String(), 10, 64); err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "%s without a numeric ID", ev.RecordType)
		}
		rec.EventID = ev.RecordType + ":" + ev.ID.String()
		if ev.RecordType == "Bounce" {
			rec.Kind, rec.HardBounce = delivery.ReceiptBounced, ev.Inactive
		} else {
			rec.Kind = delivery.ReceiptComplained
		}
		rec.Detail = strings.Join(strings.Fields("Postmark "+ev.Type+": "+ev.Description), " ")
	default:
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "unknown_type",
			"RecordType %q is not a receipt (want Delivery, Bounce or SpamComplaint)", ev.RecordType)
	}
	if raw, ok := ev.Metadata[PostmarkRefMetadata]; ok {
		ref, ok := delivery.ParseRef(raw)
		if !ok {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "Metadata.%s %q is not a reference of ours", PostmarkRefMetadata, raw)
		}
		rec.Ref = ref
	}
	if rec.Ref == "" && rec.ProviderMsgID == "" {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "neither Metadata.%s nor MessageID", PostmarkRefMetadata)
	}
	if at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "time %q is not ISO 8601", at)
		}
		rec.OccurredAt = t
	}
	return rec, nil
}
