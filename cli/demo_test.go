package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestDemo runs the demo as the Quick start does (README.md#quick-start) (on a fresh database) and checks that its
// report shows what it is meant to: a recognised resend, a successful query, a parked task, a
// provider's receipt settling that parked task, then the intake: a scheduled send, a cancel and a
// fallback chain.
func TestDemo(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	r := c.run("", "demo")
	if r.code != 0 {
		t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	is.Equal(r.code, 0)                                                                                                                         // the demo succeeds
	is.True(strings.Contains(r.stdout, "12 notifications created, 24 duplicates answered created=false"))                                       // dedupe shown
	is.True(regexp.MustCompile(`push\s+SENT\s+SEND:TIMEOUT -> SEND:ACCEPTED_REPLAY\s+2\s+1`).MatchString(r.stdout))                             // push: resend recognised, 1 message
	is.True(regexp.MustCompile(`sms\s+SENT\s+SEND:TIMEOUT -> QUERY:QUERY_FOUND\s+1\s+1`).MatchString(r.stdout))                                 // sms: looked up, 1 message
	is.True(regexp.MustCompile(`none\s+UNKNOWN \(parked\)\s+SEND:TIMEOUT\s+1\s+1`).MatchString(r.stdout))                                       // none: parked
	is.True(strings.Contains(r.stderr, "[demo-w1]") && strings.Contains(r.stderr, "[demo-w2]"))                                                 // two worker processes ran
	is.True(regexp.MustCompile(`task \d+: SENT, attempts SEND:TIMEOUT -> RECEIPT:RECEIPT_ACCEPTED`).MatchString(r.stdout))                      // a receipt settled the parked task
	is.True(regexp.MustCompile(`status: 1 scheduled, none overdue`).MatchString(r.stdout))                                                      // a scheduled send counted apart
	is.True(regexp.MustCompile(`scheduled task \d+ push SENT\s+SEND:ACCEPTED \(messages sent: 1\)`).MatchString(r.stdout))                      // then sent once
	is.Equal(len(regexp.MustCompile(`cancelled task \d+ \w+\s+SUPPRESSED SKIP:CANCELLED \(messages sent: 0\)`).FindAllString(r.stdout, -1)), 2) // a cancel: never called
	is.True(regexp.MustCompile(`chain 1\s+task \d+ push FAILED\s+SEND:REJECTED`).MatchString(r.stdout))                                         // a chain's push refused for good
	is.True(regexp.MustCompile(`chain 2\s+task \d+ sms\s+SENT\s+SEND:ACCEPTED \(messages sent: 1\)`).MatchString(r.stdout))                     // so sms is sent, once
	var open int
	is.NoErr(pool.QueryRow(t.Context(), `SELECT count(*) FROM delivery_task
		WHERE state IN ('PENDING', 'SENDING') OR (state = 'UNKNOWN' AND NOT needs_review)`).Scan(&open))
	is.Equal(open, 0) // every task settled or parked; nothing left SENDING by the shutdown
}
