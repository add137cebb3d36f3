package delivery

import (
	"errors"
	"time"
)

// ReceiptKind is what a provider said about a message after it accepted it. Every kind proves that the
// provider had the message, which is all SENT means here.
type ReceiptKind string

const (
	ReceiptAccepted    ReceiptKind = "ACCEPTED"    // queued, sending or sent by the provider
	ReceiptDelivered   ReceiptKind = "DELIVERED"   // the provider reports delivery to the recipient
	ReceiptBounced     ReceiptKind = "BOUNCED"     // the recipient's side refused it (Receipt.HardBounce: for good)
	ReceiptComplained  ReceiptKind = "COMPLAINED"  // the recipient marked it as spam
	ReceiptUndelivered ReceiptKind = "UNDELIVERED" // the provider gave up after accepting it
)

// ReceiptEffect is what recording a receipt did to its task.
type ReceiptEffect string

const (
	ReceiptSettled     ReceiptEffect = "SETTLED"     // the task became SENT, with a RECEIPT attempt
	ReceiptNoted       ReceiptEffect = "NOTED"       // the task was held: settled once its holder is done
	ReceiptUnchanged   ReceiptEffect = "UNCHANGED"   // the task was SENT already
	ReceiptContradicts ReceiptEffect = "CONTRADICTS" // the task is FAILED or SUPPRESSED: kept, shown in review
)

// Receipt sources: the signed callback formats notifier receipts verifies.
const (
	ReceiptSourceStandardWebhooks = "standard-webhooks"
	ReceiptSourceTwilio           = "twilio"
	ReceiptSourcePostmark         = "postmark"
	ReceiptSourceSES              = "ses"
)

// Receipt is one provider event about one of our messages, as a verified callback carried it.
type Receipt struct {
	Source        string      // one of the ReceiptSource constants: the callback format it was verified in
	EventID       string      // the provider's id of this event: a replay of it is recorded once
	Kind          ReceiptKind //
	HardBounce    bool        // with ReceiptBounced: the address is gone for good
	Ref           string      // our reference of the task (ParseRef), when the receipt carries it back
	ProviderMsgID string      // the provider's message id, when given (matched when Ref is empty)
	OccurredAt    time.Time   // the provider's time of the event; zero when not given
	Detail        string      // a short description, for the receipt row
}

// ReceiptResult is what recording a receipt did.
type ReceiptResult struct {
	TaskID       int64         `json:"task_id"`
	Effect       ReceiptEffect `json:"effect,omitempty"`
	State        State         `json:"state,omitempty"` // the task's state after it
	Duplicate    bool          `json:"duplicate,omitempty"`
	PrefDisabled bool          `json:"pref_disabled,omitempty"` // a hard bounce switched the preference off
}

// Errors of RecordReceipt a caller answers with a 4xx: nothing was written.
var (
	ErrUnknownReference   = errors.New("no task matches the receipt's reference or message id")
	ErrAmbiguousReference = errors.New("the receipt's message id belongs to more than one task")
)
