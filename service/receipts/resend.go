package receipts

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

// ResendRefTag is the tag our emails carry the task's ref in (service/resend).
const ResendRefTag = "notifier_ref"

// resendKinds maps Resend's email events (https://resend.com/docs/dashboard/webhooks/event-types) to
// receipt kinds. Each proves that Resend had the email: email.sent ("the API request was successful"),
// email.delivery_delayed (a temporary issue at the recipient's server), email.delivered,
// email.bounced ("the recipient's mail server permanently rejected the email": a hard bounce),
// email.complained, email.failed (Resend gave up sending it).
var resendKinds = map[string]delivery.ReceiptKind{
	"email.sent":             delivery.ReceiptAccepted,
	"email.delivery_delayed": delivery.ReceiptAccepted,
	"email.delivered":        delivery.ReceiptDelivered,
	"email.bounced":          delivery.ReceiptBounced,
	"email.complained":       delivery.ReceiptComplained,
	"email.failed":           delivery.ReceiptUndelivered,
}

// resendEvent is the part of Resend's webhook payload receipts read: {"type", "created_at", "data":
// {"email_id", "tags": {"notifier_ref": "<ref>"}}}. Resend has shown tags both as an object and as a
// list of {"name","value"}; both are read.
type resendEvent struct {
	Type      string `json:"type"`
	CreatedAt string `json:"created_at"`
	Data      struct {
		EmailID string          `json:"email_id"`
		Tags    json.RawMessage `json:"tags"`
	} `json:"data"`
}

// ParseResend reads a verified Resend webhook body (signed by Svix, read by VerifyStandardWebhook). The
// ref is the tag notifier_ref; the email id is matched when there is none. Opens, clicks and events that
// are not about an email are refused as no receipt.
func ParseResend(body []byte) (delivery.Receipt, error) {
	var ev resendEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "body is not a Resend event: %v", err)
	}
	kind, ok := resendKinds[ev.Type]
	if !ok {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "unknown_type",
			"Resend event %q is not a receipt (want email.sent, .delivery_delayed, .delivered, .bounced, .complained or .failed)", ev.Type)
	}
	rec := delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, Kind: kind, ProviderMsgID: ev.Data.EmailID,
		HardBounce: kind == delivery.ReceiptBounced, Detail: "Resend " + ev.Type}
	if raw, ok := resendTag(ev.Data.Tags, ResendRefTag); ok {
		ref, ok := delivery.ParseRef(raw)
		if !ok {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "tag %s %q is not a reference of ours", ResendRefTag, raw)
		}
		rec.Ref = ref
	}
	if rec.Ref == "" && rec.ProviderMsgID == "" {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "neither tag %s nor data.email_id", ResendRefTag)
	}
	if ev.CreatedAt != "" {
		at, err := time.Parse(time.RFC3339, ev.CreatedAt)
		if err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "created_at %q is not ISO 8601", ev.CreatedAt)
		}
		rec.OccurredAt = at
	}
	return rec, nil
}

// resendTag finds a tag's value in data.tags, an object or a list of {"name","value"}.
func resendTag(raw json.RawMessage, name string) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", false
	}
	var byName map[string]string
	if json.Unmarshal(raw, &byName) == nil {
		v, ok := byName[name]
		return v, ok
	}
	var list []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	if json.Unmarshal(raw, &list) == nil {
		for _, t := range list {
			if t.Name == name {
				return t.Value, true
			}
		}
	}
	return "", false
}
