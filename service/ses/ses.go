// Package ses sends email through Amazon SES API v2's SendEmail
// (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html), SigV4-signed by the
// AWS SDK for Go v2 (service/sesv2).
//
// Contract: NONE. SendEmail takes no idempotency key and SES offers no lookup of a message by our
// reference, so after a lost answer the task is parked; SES event publishing through SNS
// (service/receipts, /receipts/ses) settles it. Every message carries the message tag
// notifier_ref = the task's ref (EmailTags, https://docs.aws.amazon.com/ses/latest/dg/monitor-using-event-publishing.html),
// which SES puts into every event of the message (mail.tags).
//
// One request per attempt: the SDK retries by itself (3 attempts by default, on throttling, 5xx and
// broken connections: https://docs.aws.amazon.com/sdk-for-go/v2/developer-guide/configure-retries-timeouts.html),
// so the client is built with aws.NopRetryer and RetryMaxAttempts 1, and its HTTP client hands the
// transport a body it cannot rewind (as service/httpkit does), so net/http cannot resend either.
//
// Response mapping (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html#API_SendEmail_Errors,
// https://docs.aws.amazon.com/ses/latest/APIReference-V2/CommonErrors.html):
//   - 200 -> ACCEPTED with the MessageId. A 200 whose body cannot be read (or carries no MessageId) is
//     ACCEPTED too, without a provider message id: "If the action is successful, the service sends back
//     an HTTP 200 response" and the MessageId is "generated when the message is accepted" (SendEmail's
//     Response Syntax), so the status is the acceptance; SES's events then find the task by the
//     notifier_ref tag (which is why the kind requires a configuration set). Another 2xx that cannot be
//     read -> MALFORMED_RESPONSE (uncertain).
//   - Account states an operator fixes -> ACCOUNT_REFUSED naming the cause: SendingPausedException
//     (sending paused for the account or the configuration set), AccountSuspendedException (sending
//     "permanently restricted": only AWS can lift it, yet it is the account's state, not the task's),
//     MailFromDomainNotVerifiedException (the From's MAIL FROM domain is not verified: every message of
//     the channel fails alike), NotFoundException (the configuration set the channel names does not
//     exist), and the credential errors (UnrecognizedClientException, InvalidSignatureException,
//     AccessDeniedException, ExpiredToken..., any 401 or 403).
//   - MessageRejected, BadRequestException and other 4xx -> REJECTED.
//   - TooManyRequestsException, ThrottlingException, LimitExceededException and 429 -> THROTTLED with
//     Retry-After, a refusal: past its sending rate or quota "Amazon SES drops the message and doesn't
//     attempt to redeliver it" and the sender should "retry the send request"
//     (https://docs.aws.amazon.com/ses/latest/dg/manage-sending-quotas-errors.html), so the kind sets
//     ThrottleRefuses and a throttled send is retried, never parked (LimitExceededException, a 400
//     SendEmail documents as "too many instances of the specified resource type", a limit of the
//     account's, is retried too: nothing was sent, and a limit passes where a failed task stays failed).
//   - 5xx -> HTTP_5XX (uncertain: the kind sets ServerErrorsUncertain); no connection -> CONNECT_FAILED;
//     a timeout once connected -> TIMEOUT; a broken connection -> IO_ERROR.
package ses

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sesv2"
	"github.com/aws/aws-sdk-go-v2/service/sesv2/types"
	"github.com/aws/smithy-go"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

// RefTag is the message tag carrying the task's ref; SES events report it under mail.tags.
const RefTag = "notifier_ref"

// Options configure a client.
type Options struct {
	Region string // e.g. eu-west-1 (required)
	From   string // FromEmailAddress: a verified identity (required)
	// ConfigurationSet is the configuration set whose event destination (SNS) publishes the events
	// that settle parked tasks (required: without one SES publishes no tagged events, and a task whose
	// answer was lost could never be settled).
	ConfigurationSet string
	SubjectPrefix    string
	// Credentials: a static key pair when AccessKeyID is set, else the SDK's default chain
	// (environment, shared files, web identity, container and instance roles).
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// Endpoint overrides the regional endpoint (the fake in tests); https only, except to a loopback host.
	Endpoint string
	CAFile   string
	// retryer is replaced only by the negative control in the tests.
	retryer aws.Retryer
}

// Client sends email through SES. Safe for concurrent use.
type Client struct {
	api     *sesv2.Client
	from    string
	confSet string
	prefix  string
	region  string
}

// New checks the options and builds a client. Errors never contain the secret key.
func New(ctx context.Context, opt Options) (*Client, error) {
	if opt.Region == "" {
		return nil, fmt.Errorf("%w: region: required", delivery.ErrInvalidInput)
	}
	if opt.From == "" {
		return nil, fmt.Errorf("%w: from: required (an identity verified in SES)", delivery.ErrInvalidInput)
	}
	if opt.ConfigurationSet == "" {
		return nil, fmt.Errorf("%w: configuration_set: required (the configuration set whose events, tagged with notifier_ref, settle parked tasks)", delivery.ErrInvalidInput)
	}
	if (opt.AccessKeyID == "") != (opt.SecretAccessKey == "") {
		return nil, fmt.Errorf("%w: an access key id and its secret access key go together", delivery.ErrInvalidInput)
	}
	transport, err := httpkit.NewTransport(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	retryer := opt.retryer
	if retryer == nil {
		retryer = aws.NopRetryer{}
	}
	loads := []func(*config.LoadOptions) error{
		config.WithRegion(opt.Region),
		config.WithRetryer(func() aws.Retryer { return retryer }),
	}
	if opt.retryer == nil {
		loads = append(loads, config.WithRetryMaxAttempts(1))
	}
	if opt.AccessKeyID != "" {
		loads = append(loads, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(opt.AccessKeyID, opt.SecretAccessKey, opt.SessionToken)))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("%w: AWS configuration: %s", delivery.ErrInvalidInput, redact.Error(err))
	}
	var endpoint *string
	if opt.Endpoint != "" {
		u, err := url.Parse(opt.Endpoint)
		if err != nil || !(u.Scheme == "https" || u.Scheme == "http" && loopback(u.Hostname())) || u.Host == "" || u.User != nil || u.RawQuery != "" {
			return nil, fmt.Errorf("%w: endpoint %q: want an https URL (http only to a loopback host)", delivery.ErrInvalidInput, opt.Endpoint)
		}
		endpoint = aws.String(opt.Endpoint)
	}
	api := sesv2.NewFromConfig(cfg, func(o *sesv2.Options) {
		o.BaseEndpoint = endpoint
		// Set here, not in LoadDefaultConfig: the credential chain (instance and container roles) keeps
		// the SDK's own client, and only SendEmail goes through oneShot.
		o.HTTPClient = oneShot{rt: transport}
		o.Retryer = retryer
		if opt.retryer == nil {
			o.RetryMaxAttempts = 1
		}
	})
	return &Client{api: api, from: opt.From, confSet: opt.ConfigurationSet, prefix: opt.SubjectPrefix, region: opt.Region}, nil
}

func loopback(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

// String names the channel kind for logs.
func (c *Client) String() string { return "ses " + c.region }

// Input is the SendEmail request of msg.
func (c *Client) Input(msg delivery.Message) *sesv2.SendEmailInput {
	in := &sesv2.SendEmailInput{
		FromEmailAddress: aws.String(c.from),
		Destination:      &types.Destination{ToAddresses: []string{msg.To}},
		Content: &types.EmailContent{Simple: &types.Message{
			Subject: &types.Content{Data: aws.String(c.prefix + subject(msg.Body)), Charset: aws.String("UTF-8")},
			Body:    &types.Body{Text: &types.Content{Data: aws.String(msg.Body), Charset: aws.String("UTF-8")}},
		}},
		EmailTags:            []types.MessageTag{{Name: aws.String(RefTag), Value: aws.String(msg.Ref)}},
		ConfigurationSetName: aws.String(c.confSet),
	}
	return in
}

// subject is the body's first line, at most 78 characters.
func subject(body string) string {
	for i, r := range body {
		if r == '\n' || r == '\r' {
			body = body[:i]
			break
		}
	}
	if r := []rune(body); len(r) > 78 {
		body = string(r[:78])
	}
	return body
}

// Send calls SendEmail once.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	if msg.To == "" {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no address"}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, httpkit.BackstopTimeout)
		defer cancel()
	}
	p := &progress{}
	out, err := c.api.SendEmail(context.WithValue(ctx, progressKey{}, p), c.Input(msg))
	if err == nil {
		if out.MessageId == nil || *out.MessageId == "" {
			return acceptedWithoutID
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: *out.MessageId}
	}
	return classify(ctx, err, p)
}

// Query is not offered: SES cannot look a message up by our reference.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}

// acceptedWithoutID is a 200 from SendEmail whose MessageId could not be read: SES accepted the email.
var acceptedWithoutID = delivery.Observation{Outcome: delivery.OutcomeAccepted,
	Detail: "HTTP 200 without a readable MessageId: SES accepted the email; its events name the task by the notifier_ref tag"}

// accountStates are SendEmail's errors for a state of the account or of the channel's configuration
// that an operator fixes, with what to fix.
var accountStates = map[string]string{
	"SendingPausedException":             "sending is paused for the account or the configuration set: resume it in SES",
	"AccountSuspendedException":          "the account's sending is suspended by AWS: contact AWS to restore it",
	"MailFromDomainNotVerifiedException": "the From's MAIL FROM domain is not verified: fix its DNS records in SES",
	"NotFoundException":                  "the configuration set does not exist in this region: create it or fix configuration_set",
}

var credentialErrors = map[string]bool{
	"UnrecognizedClientException": true, "InvalidSignatureException": true, "AccessDeniedException": true,
	"ExpiredToken": true, "ExpiredTokenException": true, "InvalidClientTokenId": true, "IncompleteSignature": true,
	"MissingAuthenticationToken": true, "SignatureDoesNotMatch": true, "NotAuthorized": true,
}

var throttleErrors = map[string]bool{
	"TooManyRequestsException": true, "ThrottlingException": true, "Throttling": true, "LimitExceededException": true,
}

// classify maps a failed SendEmail: no status (the transport's failure, as Do's trace saw it), a 2xx
// that could not be read, or SES's error.
func classify(ctx context.Context, err error, p *progress) delivery.Observation {
	status := int(p.status.Load())
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() != 0 {
		status = re.HTTPStatusCode()
	}
	if status == 0 {
		switch {
		case !p.connected.Load() && !p.wrote.Load():
			return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "connect (nothing sent): " + redact.Error(err)}
		case errors.Is(ctx.Err(), context.DeadlineExceeded) || httpkit.IsTimeout(err):
			return delivery.Observation{Outcome: delivery.OutcomeTimeout, Detail: "no response within the client timeout"}
		}
		return delivery.Observation{Outcome: delivery.OutcomeIOError, Detail: "the connection broke after the request was sent, without an answer: " + redact.Error(err)}
	}
	code := "HTTP " + strconv.Itoa(status)
	if status == http.StatusOK {
		return acceptedWithoutID
	}
	if status >= 200 && status < 300 {
		return delivery.Observation{Outcome: delivery.OutcomeMalformed, Detail: code + ", then the answer could not be read (it may have been accepted)"}
	}
	var header http.Header
	if re != nil && re.Response != nil {
		header = re.Response.Header
	}
	var apiErr smithy.APIError
	name := ""
	if errors.As(err, &apiErr) {
		name = apiErr.ErrorCode()
		code += " " + name
	}
	switch {
	case accountStates[name] != "":
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused, Detail: code + ": " + accountStates[name]}
	case credentialErrors[name] || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: code + ": SES refused the credentials: check the access key, its secret and the IAM policy (ses:SendEmail)"}
	case throttleErrors[name] || status == http.StatusTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: httpkit.RetryAfter(header), Detail: code}
	case status >= 500:
		return (&httpkit.Response{Status: status, Header: header}).Refused()
	}
	msg := ""
	if apiErr != nil {
		msg = httpkit.Snippet([]byte(apiErr.ErrorMessage()))
	}
	return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: code + msg}
}

// progress is what one SendEmail's HTTP request learned: whether any of it may be on the wire, and the
// status of its answer.
type progress struct {
	connected, wrote atomic.Bool
	status           atomic.Int32
	requests         atomic.Int32
}

type progressKey struct{}

// maxRequestBytes bounds a SendEmail request oneShot copies: SES takes messages of up to 40 MB.
const maxRequestBytes = 40 << 20

// oneShot is the SDK's HTTP client: one RoundTrip per call, with a body the transport cannot rewind
// (no GetBody), so net/http never resends it after a broken kept-alive connection or an HTTP/2 stream
// reset; redirects are not followed.
type oneShot struct{ rt http.RoundTripper }

func (o oneShot) Do(req *http.Request) (*http.Response, error) {
	p, _ := req.Context().Value(progressKey{}).(*progress)
	if p == nil {
		p = &progress{}
	}
	p.requests.Add(1)
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn:          func(httptrace.GotConnInfo) { p.connected.Store(true) },
		WroteHeaderField: func(string, []string) { p.wrote.Store(true) },
		WroteHeaders:     func() { p.wrote.Store(true) },
	})
	req = req.WithContext(ctx)
	req.GetBody = nil
	if req.Body != nil && req.Body != http.NoBody {
		// The SDK closes its request stream as soon as Do returns, and its stream then reads as EOF. SES
		// may answer before the transport's writer has finished with the body (it reads once more past
		// Content-Length to check the length), and that writer then fails and closes the connection:
		// the next send dials and shakes hands anew (seen as two connections in
		// TestSESDropOnKeptAliveConnection, about one run in two). A copy of the (small) body that only
		// the transport reads keeps the connection; still without GetBody, so still never resent.
		body, err := io.ReadAll(io.LimitReader(req.Body, maxRequestBytes+1))
		_ = req.Body.Close()
		switch {
		case err != nil:
			return nil, fmt.Errorf("read the request body: %w", err)
		case len(body) > maxRequestBytes:
			return nil, fmt.Errorf("request body over %d bytes", maxRequestBytes)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := o.rt.RoundTrip(req)
	if err == nil {
		p.status.Store(int32(resp.StatusCode))
		resp.Body = drainOnClose{resp.Body}
	}
	return resp, err
}

// drainOnClose reads what the SDK's decoder left of a (small) answer before closing it, so the
// connection goes back to the pool instead of being closed: every send would dial and shake hands anew.
type drainOnClose struct{ io.ReadCloser }

func (d drainOnClose) Close() error {
	_, _ = io.Copy(io.Discard, io.LimitReader(d.ReadCloser, httpkit.MaxResponseBytes))
	return d.ReadCloser.Close()
}
