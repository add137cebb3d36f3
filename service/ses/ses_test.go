package ses_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/ses"
)

const (
	region = "eu-west-1"
	keyID  = "AKIAFAKESESKEY000001"
	secret = "ses-secret-key-9f8e7d6c5b4a"
	from   = "noreply@example.com"
	ref    = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
	// confSet is the configuration set the fake has and the client names.
	confSet = "notifier-events"
)

func start(t *testing.T) *fakes.SES {
	f := fakes.StartSES(region, keyID, secret, from, confSet)
	t.Cleanup(f.Close)
	return f
}

func options(f *fakes.SES) ses.Options {
	return ses.Options{Region: region, From: from, ConfigurationSet: confSet, AccessKeyID: keyID,
		SecretAccessKey: secret, Endpoint: f.URL()}
}

func client(t *testing.T, opt ses.Options) *ses.Client {
	t.Helper()
	c, err := ses.New(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func message() delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: "ada@example.org",
		Body: "Your order shipped\nTracking: 123", ExpiresAt: time.Now().Add(time.Hour), Action: delivery.ActionSend}
}

func send(c *ses.Client, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, message())
}

func TestSESAccepted(t *testing.T) {
	is := is.New(t)
	f := start(t)
	obs := send(client(t, options(f)), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // signed as SES checks it, accepted
	emails := f.Emails(ref)
	is.Equal(len(emails), 1)
	is.Equal(obs.ProviderMsgID, emails[0].ID) // SES's MessageId
	is.Equal(emails[0].Tags[ses.RefTag], ref) // the ref as a message tag
	is.Equal(emails[0].To, "ada@example.org") //
	is.Equal(emails[0].Body, message().Body)  //
	is.Equal(f.Requests(), 1)                 // one request
}

// One request per call: a dropped connection, a timeout, a 500 and a 429 are each one request, which
// the SDK would otherwise retry up to three times.
func TestSESOneRequestPerCall(t *testing.T) {
	for name, tc := range map[string]struct {
		step    fakes.Step
		timeout time.Duration
		want    delivery.Outcome
	}{
		"drop":    {fakes.Step{Drop: true}, 5 * time.Second, delivery.OutcomeIOError},
		"timeout": {fakes.Step{Delay: 2 * time.Second}, 300 * time.Millisecond, delivery.OutcomeTimeout},
		"500":     {fakes.Step{Status: 500}, 5 * time.Second, delivery.OutcomeHTTP5xx},
		"503":     {fakes.Step{Status: 503}, 5 * time.Second, delivery.OutcomeHTTP5xx},
		"429":     {fakes.Step{Status: 429, RetryAfter: "2"}, 5 * time.Second, delivery.OutcomeThrottled},
		"cut":     {fakes.Step{Malformed: true}, 5 * time.Second, delivery.OutcomeAccepted},
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			f.ScriptSend(ref, tc.step)
			obs := send(client(t, options(f)), tc.timeout)
			is.Equal(obs.Outcome, tc.want)
			is.Equal(f.Requests(), 1) // one request on the wire
		})
	}
}

// The negative control: with the SDK's default retryer, the same dropped connection and 500 are sent
// again (a second email after the drop): what the NopRetryer prevents.
func TestSESDefaultRetryerResends(t *testing.T) {
	for name, step := range map[string]fakes.Step{"drop": {Drop: true}, "500": {Status: 500}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			f.ScriptSend(ref, step)
			c := client(t, ses.WithRetryer(options(f), retry.NewStandard(func(o *retry.StandardOptions) {
				o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
			})))
			is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the retry went through
			is.Equal(f.Requests(), 2)                                          // two requests for one call
		})
	}
}

func TestSESDocumentedErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		mod    func(*ses.Options)
		step   fakes.Step
		named  string // the error SES names for step.Status, when not the fake's default
		want   delivery.Outcome
		detail string
	}{
		"unverified from": {mod: func(o *ses.Options) { o.From = "other@example.com" }, want: delivery.OutcomeRejected, detail: "MessageRejected"},
		"400":             {step: fakes.Step{Status: 400}, want: delivery.OutcomeRejected, detail: "MessageRejected"},
		"429":             {step: fakes.Step{Status: 429, RetryAfter: "3"}, want: delivery.OutcomeThrottled, detail: "TooManyRequestsException"},
		"limit exceeded":  {step: fakes.Step{Status: 400, RetryAfter: "3"}, named: "LimitExceededException", want: delivery.OutcomeThrottled, detail: "LimitExceededException"},
		"throttling 400":  {step: fakes.Step{Status: 400, RetryAfter: "3"}, named: "ThrottlingException", want: delivery.OutcomeThrottled, detail: "ThrottlingException"},
		"500":             {step: fakes.Step{Status: 500}, want: delivery.OutcomeHTTP5xx, detail: "500"},
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			f.ScriptSend(ref, tc.step)
			if tc.named != "" {
				f.NameError(tc.step.Status, tc.named, "Daily message quota exceeded.")
			}
			opt := options(f)
			if tc.mod != nil {
				tc.mod(&opt)
			}
			obs := send(client(t, opt), 5*time.Second)
			is.Equal(obs.Outcome, tc.want)
			is.True(strings.Contains(obs.Detail, tc.detail)) // names SES's error
			is.True(!strings.Contains(obs.Detail, secret) && !strings.Contains(obs.Detail, "wrong-secret-0"))
			if tc.want == delivery.OutcomeThrottled {
				is.Equal(obs.RetryAfter, 3*time.Second)
			}
			is.Equal(f.Outbound(ref), 0)
			is.Equal(f.Requests(), 1)
		})
	}
}

// A 200 whose body is cut: SES accepted the email (SendEmail answers 200 and generates the MessageId
// "when the message is accepted"), so it is ACCEPTED, without a MessageId; SES's events find the task
// by the notifier_ref tag of the configuration set's events.
func TestSESOKWithUnreadableBodyIsAccepted(t *testing.T) {
	is := is.New(t)
	f := start(t)
	f.ScriptSend(ref, fakes.Step{Malformed: true})
	obs := send(client(t, options(f)), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // the 200 is the acceptance
	is.Equal(obs.ProviderMsgID, "")                 // no MessageId could be read
	is.True(strings.Contains(obs.Detail, "200"))
	emails := f.Emails(ref)
	is.Equal(len(emails), 1)
	is.Equal(emails[0].Tags[ses.RefTag], ref) // what the events will carry
	is.Equal(emails[0].ConfigurationSet, confSet)
}

// States of the account or the channel's configuration an operator fixes are ACCOUNT_REFUSED,
// naming the cause and never a secret.
func TestSESAccountStates(t *testing.T) {
	for name, tc := range map[string]struct {
		setup  func(f *fakes.SES)
		mod    func(*ses.Options)
		detail string
	}{
		"sending paused": {setup: func(f *fakes.SES) { f.PauseSending(true) }, detail: "SendingPausedException"},
		"account suspended": {setup: func(f *fakes.SES) {
			f.ScriptSend(ref, fakes.Step{Status: 400})
			f.NameError(400, "AccountSuspendedException", "Account suspended.")
		}, detail: "AccountSuspendedException"},
		"mail from unverified": {setup: func(f *fakes.SES) {
			f.ScriptSend(ref, fakes.Step{Status: 400})
			f.NameError(400, "MailFromDomainNotVerifiedException", "MAIL FROM not verified.")
		}, detail: "MailFromDomainNotVerifiedException"},
		"no such config set": {mod: func(o *ses.Options) { o.ConfigurationSet = "other-set" }, detail: "NotFoundException"},
		"wrong secret":       {mod: func(o *ses.Options) { o.SecretAccessKey = "wrong-secret-0" }, detail: "refused the credentials"},
		"unknown key":        {mod: func(o *ses.Options) { o.AccessKeyID = "AKIAUNKNOWN000000000" }, detail: "UnrecognizedClientException"},
		"wrong region":       {mod: func(o *ses.Options) { o.Region = "us-east-1" }, detail: "InvalidSignatureException"},
		"access denied":      {setup: func(f *fakes.SES) { f.ScriptSend(ref, fakes.Step{Status: 403}) }, detail: "AccessDeniedException"},
		"expired token": {setup: func(f *fakes.SES) {
			f.ScriptSend(ref, fakes.Step{Status: 403})
			f.NameError(403, "ExpiredTokenException", "The security token included in the request is expired")
		}, detail: "ExpiredTokenException"},
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			opt := options(f)
			if tc.mod != nil {
				tc.mod(&opt)
			}
			obs := send(client(t, opt), 5*time.Second)
			is.Equal(obs.Outcome, delivery.OutcomeAccountRefused)
			is.True(strings.Contains(obs.Detail, tc.detail)) // names the cause
			is.True(!strings.Contains(obs.Detail, secret) && !strings.Contains(obs.Detail, "wrong-secret-0"))
			is.Equal(f.Outbound(ref), 0)
		})
	}
}

// The fake holds message tags to SES's rules (1-256 ASCII letters, digits, _ or -) and answers as SES
// does: 400 BadRequestException, nothing sent.
func TestSESFakeRefusesBadTags(t *testing.T) {
	for name, bad := range map[string]string{"space": "task 7", "slash": "a/b", "long": strings.Repeat("a", 257)} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			f := start(t)
			msg := message()
			msg.Ref = bad
			obs := client(t, options(f)).Send(context.Background(), msg)
			is.Equal(obs.Outcome, delivery.OutcomeRejected)
			is.True(strings.Contains(obs.Detail, "BadRequestException"))
			is.Equal(f.Outbound(bad), 0)
		})
	}
}

func TestSESDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	f := start(t)
	c := client(t, options(f))
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the connection stays open
	f.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeIOError) // uncertain
	is.Equal(f.Requests(), 2)                                         // one request for the attempt
	is.Equal(f.Conns(), 1)                                            // on the kept-alive connection
	is.Equal(f.Outbound(ref), 2)
}

func TestSESConnectFailed(t *testing.T) {
	is := is.New(t)
	c := client(t, ses.Options{Region: region, From: from, ConfigurationSet: confSet, AccessKeyID: keyID, SecretAccessKey: secret, Endpoint: "http://127.0.0.1:1"})
	is.Equal(send(c, 2*time.Second).Outcome, delivery.OutcomeConnectFailed) // nothing sent
}

func TestSESOptions(t *testing.T) {
	is := is.New(t)
	good := ses.Options{Region: region, From: from, ConfigurationSet: confSet, AccessKeyID: keyID, SecretAccessKey: secret}
	for name, mod := range map[string]func(*ses.Options){
		"no region":      func(o *ses.Options) { o.Region = "" },
		"no config set":  func(o *ses.Options) { o.ConfigurationSet = "" },
		"no from":        func(o *ses.Options) { o.From = "" },
		"half a key":     func(o *ses.Options) { o.AccessKeyID = "" },
		"plain http":     func(o *ses.Options) { o.Endpoint = "http://email.eu-west-1.amazonaws.com" },
		"endpoint creds": func(o *ses.Options) { o.Endpoint = "https://u:p@email.example.com" },
	} {
		opt := good
		mod(&opt)
		_, err := ses.New(context.Background(), opt)
		is.True(err != nil) // refused
		if err != nil {
			is.True(!strings.Contains(err.Error(), secret))
			t.Logf("%s: %v", name, err)
		}
	}
	c, err := ses.New(context.Background(), good)
	is.NoErr(err)
	is.Equal(c.String(), "ses eu-west-1")
	is.Equal(c.Query(context.Background(), ref).Outcome, delivery.OutcomeQueryFailed)
}
