package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestDemo runs the demo as the Quick start does (README.md#quick-start) (on a fresh database) and checks that its
// report shows what it is meant to: a recognised resend, a successful query, a parked task, and a
// provider's receipt settling that parked task.
func TestDemo(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	r := c.run("", "demo")
	is.Equal(r.code, 0) // the demo succeeds
	if r.code != 0 {
		t.Log(r)
	}
	is.True(strings.Contains(r.stdout, "12 notifications created, 24 duplicates answered created=false"))                  // dedupe shown
	is.True(regexp.MustCompile(`push\s+SENT\s+SEND:TIMEOUT -> SEND:ACCEPTED_REPLAY\s+2\s+1`).MatchString(r.stdout))        // push: resend recognised, 1 message
	is.True(regexp.MustCompile(`sms\s+SENT\s+SEND:TIMEOUT -> QUERY:QUERY_FOUND\s+1\s+1`).MatchString(r.stdout))            // sms: looked up, 1 message
	is.True(regexp.MustCompile(`none\s+UNKNOWN \(parked\)\s+SEND:TIMEOUT\s+1\s+1`).MatchString(r.stdout))                  // none: parked
	is.True(strings.Contains(r.stderr, "[demo-w1]") && strings.Contains(r.stderr, "[demo-w2]"))                            // two worker processes ran
	is.True(regexp.MustCompile(`task \d+: SENT, attempts SEND:TIMEOUT -> RECEIPT:RECEIPT_ACCEPTED`).MatchString(r.stdout)) // a receipt settled the parked task
	var open int
	is.NoErr(pool.QueryRow(t.Context(), `SELECT count(*) FROM delivery_task
		WHERE state IN ('PENDING', 'SENDING') OR (state = 'UNKNOWN' AND NOT needs_review)`).Scan(&open))
	is.Equal(open, 0) // every task settled or parked; nothing left SENDING by the shutdown
}
