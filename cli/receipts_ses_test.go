package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
)

// TestReceiptsSES: `notifier receipts --ses-topic-arn` confirms its SNS subscription, verifies SNS's
// signature by the certificate it fetches over HTTPS from the (fake) SNS host, and ends two parked tasks:
// one by a Delivery event carrying the task's ref in its tags (recorded once though SNS retries it), one
// by a permanent Bounce matched by SES's message id, which with --disable-on-bounce switches the user's
// preference off. A forged message and a foreign topic's write nothing; bad flags exit 2.
func TestReceiptsSES(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	ctx := context.Background()
	sns := fakes.StartSNS("eu-west-1")
	t.Cleanup(sns.Close)
	ca := filepath.Join(t.TempDir(), "sns-ca.pem")
	is.NoErr(os.WriteFile(ca, sns.CAPEM(), 0o600))
	const topic = "arn:aws:sns:eu-west-1:123456789012:notifier-ses-events"

	const sesMessageID = "0100018c6f3a2b1c-5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c-000000"
	delivered, bounced := parkedTask(t, pool), parkedTaskWithMsgID(t, pool, sesMessageID)
	_, err := pool.Exec(ctx, `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'u1@example.com')`)
	is.NoErr(err)

	rc := c.loginAs(pool, "notifier_receiver")
	p := rc.start("--log-format", "json", "receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", topic,
		"--sns-ca-file", ca, "--sns-connect-to", sns.Addr(), "--disable-on-bounce", "--sweep", "100ms")
	addr := receiptsAddr(t, p)
	post := func(m fakes.SNSMessage) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/receipts/ses", bytes.NewReader(m.JSON()))
		is.NoErr(err)
		req.Header.Set("Content-Type", "text/plain; charset=UTF-8")
		req.Header.Set("x-amz-sns-message-type", m["Type"])
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err)
		resp.Body.Close()
		return resp.StatusCode
	}
	count := func() (n int) {
		is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_receipt`).Scan(&n))
		return n
	}

	if code := post(sns.SubscriptionConfirmation(topic, 2)); code != http.StatusOK {
		t.Fatalf("confirmation: got %d: %s", code, p.stderr)
	}
	is.Equal(sns.Confirmed(topic), 1) // the subscription is confirmed

	delivery := sns.Notification(topic, fakes.SESEvent{EventType: "Delivery", MessageID: "0100-other-000000",
		Ref: refOf(t, pool, delivered)}.JSON(), 1)
	forged := sns.Notification(topic, fakes.SESEvent{EventType: "Delivery", Ref: refOf(t, pool, delivered)}.JSON(), 2)
	forged["Signature"] = "AAAA" + forged["Signature"][4:]
	is.Equal(post(forged), http.StatusUnauthorized) // a bad signature
	foreign := sns.Notification("arn:aws:sns:eu-west-1:123456789012:other", fakes.SESEvent{EventType: "Delivery",
		Ref: refOf(t, pool, delivered)}.JSON(), 2)
	is.Equal(post(foreign), http.StatusForbidden) // another topic
	is.Equal(count(), 0)                          // nothing written

	if code := post(delivery); code != http.StatusOK {
		t.Fatalf("delivery: got %d: %s", code, p.stderr)
	}
	is.Equal(post(delivery), http.StatusOK) // SNS retries it: recorded once
	bounce := sns.Notification(topic, fakes.SESEvent{EventType: "Bounce", BounceType: "Permanent", MessageID: sesMessageID}.JSON(), 2)
	is.Equal(post(bounce), http.StatusOK)
	is.Equal(count(), 2)

	for id, want := range map[int64][2]any{delivered: {"DELIVERED", false}, bounced: {"BOUNCED", true}} {
		var state, source, kind string
		var hard bool
		is.NoErr(pool.QueryRow(ctx, `SELECT t.state, r.source, r.kind, r.hard_bounce FROM delivery_task t
			JOIN delivery_receipt r ON r.task_id = t.id WHERE t.id = $1`, id).Scan(&state, &source, &kind, &hard))
		is.Equal(state, "SENT") // the parked task is settled
		is.Equal(source, "ses")
		is.Equal(kind, want[0])
		is.Equal(hard, want[1])
	}
	var enabled bool
	is.NoErr(pool.QueryRow(ctx, `SELECT enabled FROM channel_pref WHERE user_id = 'u1' AND channel = 'push'`).Scan(&enabled))
	is.True(!enabled) // --disable-on-bounce: the permanent bounce switched the preference off

	fetched := 0
	for _, u := range sns.Fetches() {
		if u == sns.CertURL() {
			fetched++
		}
	}
	is.Equal(fetched, 1) // the signing certificate, once, over HTTPS
	metrics := scrape(t, "http://"+addr+"/metrics")
	for _, line := range []string{`{result="settled",source="ses"} 2`, `{result="duplicate",source="ses"} 1`,
		`{result="bad_signature",source="ses"} 1`, `{result="foreign_topic",source="ses"} 1`,
		`{result="subscription_confirmed",source="ses"} 1`} {
		is.True(strings.Contains(metrics, "notifier_receipts_total"+line))
	}
	is.Equal(p.stop(syscall.SIGTERM), 0)

	for _, args := range [][]string{
		{"receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", "arn:aws:sqs:eu-west-1:123456789012:q"},
		{"receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", "notifier-ses-events"},
		{"receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", topic, "--sns-fetch-timeout", "0s"},
		{"receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", topic, "--sns-connect-to", "192.0.2.1:443"},
		{"receipts", "--listen", "127.0.0.1:0", "--ses-topic-arn", topic, "--sns-ca-file", filepath.Join(t.TempDir(), "missing.pem")},
		{"receipts", "--listen", "127.0.0.1:0", "--sns-connect-to", sns.Addr()},
	} {
		r := c.run("", args...)
		is.Equal(r.code, 2) // usage
		oneErrorLine(t, r)
		t.Log(strings.TrimSpace(r.stderr))
	}
	is.Equal(count(), 2) // bad flags wrote nothing
}
