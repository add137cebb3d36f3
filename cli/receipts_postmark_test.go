package cli

import (
	"context"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"
)

func init() { os.Setenv("PM_WEBHOOK_PASSWORD", "pm-webhook-pass") }

// TestReceiptsPostmark: `notifier receipts` with Postmark's webhook credentials settles a parked task
// on a Delivery webhook carrying the task's ref in its Metadata, refuses one without the credentials
// (writing nothing), records a retried webhook once, and refuses half a credential at start.
func TestReceiptsPostmark(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	ctx := context.Background()
	parked := parkedTask(t, pool)
	rc := c.loginAs(pool, "notifier_receiver")
	p := rc.start("--log-format", "json", "receipts", "--listen", "127.0.0.1:0",
		"--postmark-user", "postmark", "--postmark-password-env", "PM_WEBHOOK_PASSWORD", "--sweep", "100ms")
	addr := receiptsAddr(t, p)
	body := `{"RecordType":"Delivery","ServerID":23,"MessageStream":"outbound","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483",
		"Recipient":"u1@example.com","DeliveredAt":"2026-12-03T16:33:54.9070259Z","Metadata":{"notifier_ref":"` + refOf(t, pool, parked) + `"}}`
	post := func(user, password string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/receipts/postmark", strings.NewReader(body))
		is.NoErr(err)
		req.Header.Set("Content-Type", "application/json")
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err)
		resp.Body.Close()
		return resp.StatusCode
	}
	count := func() (n int) {
		is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_receipt`).Scan(&n))
		return n
	}
	is.Equal(post("", ""), http.StatusUnauthorized)                         // no credentials
	is.Equal(post("postmark", "guess"), http.StatusUnauthorized)            // wrong ones
	is.Equal(count(), 0)                                                    // nothing written
	if code := post("postmark", "pm-webhook-pass"); code != http.StatusOK { // Postmark's own
		t.Fatalf("got %d: %s", code, p.stderr)
	}
	is.Equal(post("postmark", "pm-webhook-pass"), http.StatusOK) // retried by Postmark
	is.Equal(count(), 1)                                         // recorded once
	var state, source string
	is.NoErr(pool.QueryRow(ctx, `SELECT t.state, r.source FROM delivery_task t JOIN delivery_receipt r ON r.task_id = t.id WHERE t.id = $1`, parked).Scan(&state, &source))
	is.Equal(state, "SENT")      // the parked task is settled
	is.Equal(source, "postmark") // by a Postmark receipt
	metrics := scrape(t, "http://"+addr+"/metrics")
	is.True(strings.Contains(metrics, `notifier_receipts_total{result="settled",source="postmark"} 1`))
	is.True(strings.Contains(metrics, `notifier_receipts_total{result="bad_signature",source="postmark"} 2`))
	is.Equal(p.stop(syscall.SIGTERM), 0)

	for _, args := range [][]string{
		{"receipts", "--listen", "127.0.0.1:0", "--postmark-user", "postmark"},
		{"receipts", "--listen", "127.0.0.1:0", "--postmark-password-env", "PM_WEBHOOK_PASSWORD"},
		{"receipts", "--listen", "127.0.0.1:0", "--postmark-header", "X-Token"},
		{"receipts", "--listen", "127.0.0.1:0", "--postmark-header", "X Token", "--postmark-header-value-env", "PM_WEBHOOK_PASSWORD"},
	} {
		r := c.run("", args...)
		is.Equal(r.code, 2) // usage
		oneErrorLine(t, r)
		is.True(!strings.Contains(r.stderr, "pm-webhook-pass")) // never the secret
	}
}
