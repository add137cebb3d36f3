package receipts_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/receipts"
)

const pmRef = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a"

// Bodies in the shape of Postmark's documented examples (delivery, bounce and spam complaint webhooks).
const (
	pmDelivery = `{"RecordType":"Delivery","ServerID":23,"MessageStream":"outbound","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483",
		"Recipient":"john@example.com","Tag":"welcome-email","DeliveredAt":"2019-11-05T16:33:54.9070259Z","Details":"Test delivery webhook details",
		"Metadata":{"notifier_ref":"` + pmRef + `"}}`
	pmHardBounce = `{"RecordType":"Bounce","ID":4323372036854775807,"Type":"HardBounce","TypeCode":1,"Name":"Hard bounce","Tag":"Test",
		"MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","ServerID":23,"MessageStream":"outbound","Description":"The server was unable to deliver your message (ex: unknown user, mailbox not found).",
		"Details":"Test bounce details","Email":"john@example.com","From":"sender@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z",
		"DumpAvailable":true,"Inactive":true,"CanActivate":true,"Subject":"Test subject","Content":"<Full dump of bounce>","Metadata":{"notifier_ref":"ntf-` + pmRef + `"}}`
	pmSoftBounce = `{"RecordType":"Bounce","ID":42,"Type":"SoftBounce","TypeCode":4096,"MessageID":"883953f4-6105-42a2-a16a-77a8eac79483",
		"Description":"Mailbox full","Email":"john@example.com","BouncedAt":"2019-11-05T16:33:54Z"}`
	pmComplaint = `{"RecordType":"SpamComplaint","ID":43,"Type":"SpamComplaint","TypeCode":512,"MessageID":"883953f4-6105-42a2-a16a-77a8eac79483",
		"Email":"john@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z","Metadata":{"notifier_ref":"` + pmRef + `"}}`
)

func TestParsePostmark(t *testing.T) {
	is := is.New(t)
	rec, err := receipts.ParsePostmark([]byte(pmDelivery))
	is.NoErr(err)
	is.Equal(rec.Source, delivery.ReceiptSourcePostmark)
	is.Equal(rec.Kind, delivery.ReceiptDelivered)                       // Delivery
	is.Equal(rec.Ref, pmRef)                                            // from Metadata
	is.Equal(rec.ProviderMsgID, "883953f4-6105-42a2-a16a-77a8eac79483") // and the MessageID
	is.Equal(rec.EventID, "Delivery:883953f4-6105-42a2-a16a-77a8eac79483:john@example.com")
	is.Equal(rec.OccurredAt.Year(), 2019) // DeliveredAt

	rec, err = receipts.ParsePostmark([]byte(pmHardBounce))
	is.NoErr(err)
	is.Equal(rec.Kind, delivery.ReceiptBounced)         // Bounce
	is.True(rec.HardBounce)                             // HardBounce: for good
	is.Equal(rec.Ref, pmRef)                            // ntf-<ref> read too
	is.Equal(rec.EventID, "Bounce:4323372036854775807") // the bounce's ID, whole

	rec, err = receipts.ParsePostmark([]byte(pmSoftBounce))
	is.NoErr(err)
	is.Equal(rec.Kind, delivery.ReceiptBounced)
	is.True(!rec.HardBounce)         // a full mailbox is not for good
	is.Equal(rec.Ref, "")            // no metadata:
	is.True(rec.ProviderMsgID != "") // matched by MessageID

	// Postmark's Inactive flag decides, not the bounce's type.
	active := strings.Replace(pmHardBounce, `"Inactive":true`, `"Inactive":false`, 1)
	rec, err = receipts.ParsePostmark([]byte(active))
	is.NoErr(err)
	is.Equal(rec.Kind, delivery.ReceiptBounced)
	is.True(!rec.HardBounce) // a hard bounce Postmark keeps active: the address is not gone
	deactivated := strings.Replace(pmSoftBounce, `"Description"`, `"Inactive":true,"Description"`, 1)
	rec, err = receipts.ParsePostmark([]byte(deactivated))
	is.NoErr(err)
	is.True(rec.HardBounce) // a soft bounce after which Postmark deactivated the address: gone

	rec, err = receipts.ParsePostmark([]byte(pmComplaint))
	is.NoErr(err)
	is.Equal(rec.Kind, delivery.ReceiptComplained) // SpamComplaint
	is.Equal(rec.EventID, "SpamComplaint:43")

	for name, body := range map[string]string{
		"open":     `{"RecordType":"Open","MessageID":"x"}`,
		"not json": `{`,
		"foreign":  `{"RecordType":"Delivery","MessageID":"m","Metadata":{"notifier_ref":"someone-elses"}}`,
		"no id":    `{"RecordType":"Bounce","Type":"HardBounce","MessageID":"m"}`,
		"nothing":  `{"RecordType":"Bounce","ID":1,"Type":"HardBounce"}`,
		"bad time": `{"RecordType":"Delivery","MessageID":"m","DeliveredAt":"yesterday"}`,
	} {
		_, err := receipts.ParsePostmark([]byte(body))
		is.True(err != nil) // refused
		t.Logf("%s: %v", name, err)
	}
}

// Postmark signs nothing: the endpoint is served only with credentials, and a request without them,
// with wrong ones, or with only one of two configured, is refused before anything is recorded.
func TestHandlerPostmarkAuthentication(t *testing.T) {
	is := is.New(t)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 7, Effect: delivery.ReceiptSettled, State: delivery.StateSent}}
	auth := receipts.PostmarkAuth{Username: "postmark", Password: "s3cret-pass", Header: "X-Receipt-Token", HeaderValue: "hdr-token"}
	h := receipts.NewHandler(rec, receipts.Config{Postmark: auth})
	post := func(user, pass, header string) int {
		r := httptest.NewRequest(http.MethodPost, "/receipts/postmark", strings.NewReader(pmDelivery))
		if user != "" || pass != "" {
			r.SetBasicAuth(user, pass)
		}
		if header != "" {
			r.Header.Set("X-Receipt-Token", header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	is.Equal(post("", "", ""), http.StatusUnauthorized)                             // nothing
	is.Equal(post("postmark", "wrong", "hdr-token"), http.StatusUnauthorized)       // a wrong password
	is.Equal(post("other", "s3cret-pass", "hdr-token"), http.StatusUnauthorized)    // a wrong user
	is.Equal(post("postmark", "s3cret-pass", ""), http.StatusUnauthorized)          // the header missing
	is.Equal(post("postmark", "s3cret-pass", "hdr-wrong"), http.StatusUnauthorized) // the header wrong
	is.Equal(len(rec.got), 0)                                                       // nothing recorded
	is.Equal(post("postmark", "s3cret-pass", "hdr-token"), http.StatusOK)           // both right
	is.Equal(len(rec.got), 1)
	is.Equal(rec.got[0].Ref, pmRef)

	only := receipts.NewHandler(rec, receipts.Config{Postmark: receipts.PostmarkAuth{Username: "postmark", Password: "s3cret-pass"}})
	r := httptest.NewRequest(http.MethodPost, "/receipts/postmark", strings.NewReader(pmDelivery))
	r.SetBasicAuth("postmark", "s3cret-pass")
	w := httptest.NewRecorder()
	only.ServeHTTP(w, r)
	is.Equal(w.Code, http.StatusOK) // basic authentication alone, when that is all that is configured

	none := receipts.NewHandler(rec, receipts.Config{TwilioAuthToken: "tok"})
	w = httptest.NewRecorder()
	none.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/receipts/postmark", strings.NewReader(pmDelivery)))
	is.Equal(w.Code, http.StatusNotFound) // without credentials the endpoint is not served
}
