package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service/receipts"
	"github.com/notifierhq/notifier/service/webhook"
)

const receiptsSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// The receiver's secrets come from its environment (never a flag's value: it would show in ps); the
// processes these tests start inherit the test's.
func init() {
	os.Setenv("HOOK_SECRET", receiptsSecret)
	os.Setenv("TWILIO_TOKEN", "twilio-token")
}

// receiptsAddr waits for the "serving receipts" log line (--log-format json) and returns its address.
func receiptsAddr(t *testing.T, p *process) string {
	t.Helper()
	var addr string
	testworld.Eventually(t, 20*time.Second, "the receipts address in the log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving receipts" {
				addr = line.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// TestReceiptsServer: `notifier receipts`, run as a login of the receiver role, settles a parked task on
// a signed Standard Webhooks receipt and a Twilio callback, refuses an unsigned one and writes nothing
// for it, answers a replay as a duplicate, and counts all of it in its metrics. The demo's story: a
// task parked for a human, settled by the provider's own word.
func TestReceiptsServer(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	ctx := context.Background()
	parked, viaTwilio := parkedTask(t, pool), parkedTask(t, pool)
	rc := c.loginAs(pool, "notifier_receiver")
	p := rc.start("--log-format", "json", "receipts", "--listen", "127.0.0.1:0", "--webhook-secret-env", "HOOK_SECRET",
		"--twilio-token-env", "TWILIO_TOKEN", "--public-url", "https://receipts.example", "--sweep", "100ms")
	addr := receiptsAddr(t, p)
	key, err := webhook.ParseSecret(receiptsSecret)
	is.NoErr(err)
	post := func(body, id string, signed bool) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/receipts/standard-webhooks", strings.NewReader(body))
		is.NoErr(err)
		ts := time.Now().Unix()
		sig := webhook.Sign(key, id, ts, []byte(body))
		if !signed {
			sig = "v1,c2lnbmVkIGJ5IHNvbWVvbmUgZWxzZQ=="
		}
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err)
		resp.Body.Close()
		return resp
	}
	body := `{"type":"message.delivered","data":{"ref":"ntf-` + refOf(t, pool, parked) + `"}}`

	is.Equal(post(body, "evt-forged", false).StatusCode, http.StatusUnauthorized) // unsigned: refused
	var receiptsCount int
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_receipt`).Scan(&receiptsCount))
	is.Equal(receiptsCount, 0) // and nothing written

	is.Equal(post(body, "evt-1", true).StatusCode, http.StatusOK) // signed: recorded
	var state string
	is.NoErr(pool.QueryRow(ctx, `SELECT state FROM delivery_task WHERE id = $1`, parked).Scan(&state))
	is.Equal(state, "SENT")                                       // the parked task is settled
	is.Equal(post(body, "evt-1", true).StatusCode, http.StatusOK) // a replay is answered
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_receipt`).Scan(&receiptsCount))
	is.Equal(receiptsCount, 1) // and recorded once

	form := url.Values{"MessageSid": {"SM42"}, "MessageStatus": {"delivered"}}
	path := "/receipts/twilio?ref=ntf-" + refOf(t, pool, viaTwilio)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(form.Encode()))
	is.NoErr(err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", receipts.TwilioSignature("twilio-token", "https://receipts.example"+path, form))
	resp, err := http.DefaultClient.Do(req)
	is.NoErr(err)
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusOK) // Twilio's callback, signed for the public URL
	is.NoErr(pool.QueryRow(ctx, `SELECT state FROM delivery_task WHERE id = $1`, viaTwilio).Scan(&state))
	is.Equal(state, "SENT")

	metrics := scrape(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`notifier_receipts_total{result="bad_signature",source="standard-webhooks"} 1`,
		`notifier_receipts_total{result="settled",source="standard-webhooks"} 1`,
		`notifier_receipts_total{result="duplicate",source="standard-webhooks"} 1`,
		`notifier_receipts_total{result="settled",source="twilio"} 1`,
	} {
		is.True(strings.Contains(metrics, want)) // counted
	}
	is.Equal(p.stop(syscall.SIGTERM), 0) // a clean stop
}

// Without its role the receiver says so at start; without a secret, or Twilio without the public URL,
// it refuses to start (exit 2).
func TestReceiptsRefusesBadSetups(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	r := c.loginAs(pool, "notifier_worker").run("", "receipts", "--listen", "127.0.0.1:0", "--webhook-secret-env", "HOOK_SECRET")
	is.Equal(r.code, 1)                                                              // a runtime refusal
	is.True(strings.Contains(r.stderr, "receipts needs the notifier_receiver role")) // naming the role
	for _, args := range [][]string{
		{"receipts", "--listen", "127.0.0.1:0"},
		{"receipts", "--listen", "127.0.0.1:0", "--twilio-token-env", "TWILIO_TOKEN"},
		{"receipts", "--listen", "127.0.0.1:0", "--webhook-secret-env", "UNSET_VARIABLE"},
		{"receipts", "--listen", "nowhere", "--webhook-secret-env", "HOOK_SECRET"},
	} {
		r := c.run("", args...)
		is.Equal(r.code, 2)    // usage
		oneErrorLine(t, r)     // one clear line
		is.Equal(r.stdout, "") // nothing served
	}
}
