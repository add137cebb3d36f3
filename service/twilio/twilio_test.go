package twilio_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/twilio"
)

const (
	account   = "AC0123456789abcdef0123456789abcdef"
	authToken = "tw-auth-token-5d1c8e0f"
	apiKey    = "SK0123456789abcdef0123456789abcdef"
	apiSecret = "tw-api-secret-93b7a2c4"
	ref       = "8d2e1f0a-3b4c-4d5e-9f60-718293a4b5c6"
	callback  = "https://notifier.example.com/receipts/twilio"
	number    = "+15005550006"
)

func client(t *testing.T, base string, mod func(*twilio.Options)) *twilio.Client {
	t.Helper()
	opt := twilio.Options{AccountSID: account, Username: apiKey, Password: apiSecret, From: "+15017122661",
		StatusCallbackURL: callback, BaseURL: base}
	if mod != nil {
		mod(&opt)
	}
	c, err := twilio.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func start(t *testing.T) *fakes.Twilio {
	f := fakes.StartTwilio(account, authToken)
	f.AddAPIKey(apiKey, apiSecret)
	t.Cleanup(f.Close)
	return f
}

func message() delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: number, Body: "Your code is 123456",
		ExpiresAt: time.Now().Add(time.Hour), Action: delivery.ActionSend}
}

func send(c *twilio.Client, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, message())
}

func TestTwilioAccepted(t *testing.T) {
	is := is.New(t)
	f := start(t)
	obs := send(client(t, f.URL(), nil), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // accepted
	msgs := f.Messages(ref)
	is.Equal(len(msgs), 1)                                                                      // one SMS, found by the callback's ref
	is.Equal(obs.ProviderMsgID, msgs[0].ID)                                                     // Twilio's SM sid
	is.True(strings.HasPrefix(obs.ProviderMsgID, "SM"))                                         //
	is.Equal(msgs[0].StatusCallback, callback+"?ref="+ref)                                      // our receipts endpoint with the ref
	is.Equal(msgs[0].To, number)                                                                //
	is.True(msgs[0].ValidityPeriod == "3599" || msgs[0].ValidityPeriod == "3600")               // the remaining lifetime
	is.Equal(f.Requests(), 1)                                                                   // one request
	c := client(t, f.URL(), func(o *twilio.Options) { o.Username, o.Password = "", authToken }) // account SID + auth token
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(f.Outbound(ref), 2) // no dedupe at Twilio: each request is a new SMS
}

func TestTwilioValidityPeriodCappedAndExpired(t *testing.T) {
	is := is.New(t)
	f := start(t)
	c := client(t, f.URL(), nil)
	msg := message()
	msg.ExpiresAt = time.Now().Add(48 * time.Hour)
	is.Equal(c.Send(context.Background(), msg).Outcome, delivery.OutcomeAccepted)
	is.Equal(f.Messages(ref)[0].ValidityPeriod, "36000") // Twilio's maximum
	msg.ExpiresAt = time.Now().Add(-time.Second)
	obs := c.Send(context.Background(), msg)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // not sent
	is.Equal(obs.Detail, "expired")
	is.Equal(f.Requests(), 1)
}

func TestTwilioLostAnswer(t *testing.T) {
	is := is.New(t)
	f := start(t)
	c := client(t, f.URL(), nil)
	f.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second})
	is.Equal(send(c, 200*time.Millisecond).Outcome, delivery.OutcomeTimeout) // queued, answer late
	f.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeIOError) // queued, connection dropped
	is.Equal(f.Outbound(ref), 2)                                      // each one an SMS: uncertain, never "failed"
}

// A 201 Created whose body is cut: Twilio created the message ("201 CREATED: ... We created a new
// resource", https://www.twilio.com/docs/usage/twilios-response), so it is ACCEPTED, without a message
// sid; the status callback finds the task by the ref its StatusCallback carries.
func TestTwilioCreatedWithUnreadableBodyIsAccepted(t *testing.T) {
	is := is.New(t)
	f := start(t)
	c := client(t, f.URL(), nil)
	f.ScriptSend(ref, fakes.Step{Malformed: true})
	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // the status proves the message exists
	is.Equal(obs.ProviderMsgID, "")                 // no sid could be read
	is.True(strings.Contains(obs.Detail, "201"))
	is.Equal(f.Outbound(ref), 1)
	is.Equal(f.Messages(ref)[0].StatusCallback, callback+"?ref="+ref) // the callback still names the task
}

// Only a 201 is Twilio's documented proof; another 2xx without a sid stays uncertain.
func TestTwilioClassifyOther2xxWithoutSid(t *testing.T) {
	is := is.New(t)
	is.Equal(twilio.Classify(201, nil, []byte(`{"sid":"SMab`)).Outcome, delivery.OutcomeAccepted)
	is.Equal(twilio.Classify(200, nil, []byte(`{"sid":"SMab`)).Outcome, delivery.OutcomeMalformed)
	is.Equal(twilio.Classify(200, nil, []byte(`{"sid":"SMab"}`)).ProviderMsgID, "SMab")
}

// Account states an operator fixes are ACCOUNT_REFUSED, naming the cause and never a secret: the
// credential (401, 20003), an inactive account (20005, 10001), a From that is not the account's (21606).
func TestTwilioAccountStates(t *testing.T) {
	for name, tc := range map[string]struct {
		setup  func(f *fakes.Twilio)
		mod    func(*twilio.Options)
		detail string
	}{
		"bad secret 20003": {mod: func(o *twilio.Options) { o.Password = "wrong-secret-x" }, detail: "refused the credentials"},
		"suspended 20005":  {setup: func(f *fakes.Twilio) { f.Suspend(true) }, detail: "20005"},
		"from not owned 21606": {setup: func(f *fakes.Twilio) { f.SetOwnedNumbers("+15017122662") },
			detail: "From number is not a message-capable Twilio number"},
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			obs := send(client(t, f.URL(), tc.mod), 5*time.Second)
			is.Equal(obs.Outcome, delivery.OutcomeAccountRefused)
			is.True(strings.Contains(obs.Detail, tc.detail))
			for _, secret := range []string{apiSecret, authToken, "wrong-secret-x", number} {
				is.True(!strings.Contains(obs.Detail, secret)) // no credential, no phone number
			}
			is.Equal(f.Outbound(ref), 0) // nothing queued
		})
	}
	is := is.New(t)
	for code, want := range map[string]delivery.Outcome{
		`{"code":10001,"status":403}`: delivery.OutcomeAccountRefused,
		`{"code":20003,"status":401}`: delivery.OutcomeAccountRefused,
		`{"code":21211,"status":400}`: delivery.OutcomeRejected,
	} {
		is.Equal(twilio.Classify(400, nil, []byte(code)).Outcome, want) // by Twilio's code
	}
	is.Equal(twilio.Classify(403, nil, nil).Outcome, delivery.OutcomeAccountRefused)
}

func TestTwilioDocumentedErrors(t *testing.T) {
	cases := []struct {
		name         string
		setup        func(f *fakes.Twilio)
		mod          func(*twilio.Options)
		to           string
		want         delivery.Outcome
		unregistered bool
		retryAfter   time.Duration
		detail       string
	}{
		{name: "invalid To 21211", to: "12345", want: delivery.OutcomeRejected, detail: "21211"},
		{name: "unsubscribed 21610", setup: func(f *fakes.Twilio) { f.SetUnsubscribed(number) },
			want: delivery.OutcomeRejected, unregistered: true, detail: "21610"},
		{name: "another account 20404", mod: func(o *twilio.Options) { o.AccountSID = "AC" + strings.Repeat("f", 32) },
			want: delivery.OutcomeRejected, detail: "20404"},
		{name: "429", setup: func(f *fakes.Twilio) { f.ScriptSend(ref, fakes.Step{Status: 429, RetryAfter: "7"}) },
			want: delivery.OutcomeThrottled, retryAfter: 7 * time.Second, detail: "20429"},
		{name: "500", setup: func(f *fakes.Twilio) { f.ScriptSend(ref, fakes.Step{Status: 500}) },
			want: delivery.OutcomeHTTP5xx, detail: "500"},
		{name: "503", setup: func(f *fakes.Twilio) { f.ScriptSend(ref, fakes.Step{Status: 503, RetryAfter: "3"}) },
			want: delivery.OutcomeHTTP5xx, retryAfter: 3 * time.Second, detail: "503"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			c := client(t, f.URL(), tc.mod)
			msg := message()
			if tc.to != "" {
				msg.To = tc.to
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			obs := c.Send(ctx, msg)
			is.Equal(obs.Outcome, tc.want)
			is.Equal(obs.Unregistered, tc.unregistered)
			is.Equal(obs.RetryAfter, tc.retryAfter)
			is.True(strings.Contains(obs.Detail, tc.detail)) // names the code
			for _, secret := range []string{apiSecret, authToken, "wrong-secret-x", number} {
				is.True(!strings.Contains(obs.Detail, secret)) // no credential, no phone number
			}
			is.Equal(f.Outbound(ref), 0) // nothing queued
			is.Equal(f.Requests(), 1)
		})
	}
}

// The form Twilio documents, with a messaging service instead of From.
func TestTwilioRequestOnTheWire(t *testing.T) {
	is := is.New(t)
	c := client(t, "http://127.0.0.1:1", func(o *twilio.Options) { o.From, o.MessagingServiceSID = "", "MG0123" })
	form := c.Form(message(), 60)
	is.Equal(form.Get("MessagingServiceSid"), "MG0123")
	is.Equal(form.Get("From"), "")
	is.Equal(form.Get("ValidityPeriod"), "60")
	is.Equal(form.Get("StatusCallback"), callback+"?ref="+ref)
	base, _ := url.Parse("https://h.example/receipts/twilio?tenant=a")
	is.Equal(twilio.StatusCallback(base, "r1"), "https://h.example/receipts/twilio?ref=r1&tenant=a") // keeps the query
}

func TestTwilioDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	f := start(t)
	c := client(t, f.URL(), nil)
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the connection stays open
	f.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeIOError) // uncertain
	is.Equal(f.Requests(), 2)                                         // one request for the attempt
	is.Equal(f.Conns(), 1)                                            // on the kept-alive connection
	is.Equal(f.Outbound(ref), 2)
}

func TestTwilioOptions(t *testing.T) {
	is := is.New(t)
	good := twilio.Options{AccountSID: account, Password: authToken, From: "+15017122661", StatusCallbackURL: callback}
	for name, mod := range map[string]func(*twilio.Options){
		"bad account":     func(o *twilio.Options) { o.AccountSID = "AC12/../x" },
		"no password":     func(o *twilio.Options) { o.Password = "" },
		"no sender":       func(o *twilio.Options) { o.From = "" },
		"two senders":     func(o *twilio.Options) { o.MessagingServiceSID = "MG1" },
		"no callback":     func(o *twilio.Options) { o.StatusCallbackURL = "" },
		"callback creds":  func(o *twilio.Options) { o.StatusCallbackURL = "https://u:p@h/receipts/twilio" },
		"plain http base": func(o *twilio.Options) { o.BaseURL = "http://api.twilio.com" },
		"base with query": func(o *twilio.Options) { o.BaseURL = "https://api.twilio.com/?x=1" },
	} {
		opt := good
		mod(&opt)
		_, err := twilio.New(opt)
		is.True(err != nil) // refused
		if err != nil {
			is.True(!strings.Contains(err.Error(), authToken)) // never the secret
			t.Logf("%s: %v", name, err)
		}
	}
	c, err := twilio.New(good)
	is.NoErr(err)
	is.Equal(c.String(), "twilio")
	is.Equal(c.Query(context.Background(), ref).Outcome, delivery.OutcomeQueryFailed) // no query by our ref
}
