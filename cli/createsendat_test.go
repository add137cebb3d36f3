package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// TestCreateSendAt: create --delay and --send-at schedule an event (show prints its send time, status
// counts its task as scheduled); a send time at or after the expiry, both flags, or a bad value is
// refused with exit 2, writing nothing; the same through --jsonl's "send_at", one line at a time.
func TestCreateSendAt(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")

	r := c.ok("create", "--user", "u1", "--event-key", "later", "--body", "b", "--delay", "90m")
	var o createOutput
	decode(t, r.stdout, &o)
	is.True(o.Created)
	r = c.ok("show", "--user", "u1", "--event-key", "later")
	var rep service.NotificationReport
	decode(t, r.stdout, &rep)
	is.True(rep.SendAt != nil) // show prints the send time
	is.True(rep.SendAt.Sub(rep.CreatedAt) == 90*time.Minute)
	r = c.ok("create", "--user", "u1", "--event-key", "past", "--body", "b", "--send-at", "2020-01-02T03:04:05Z")
	decode(t, r.stdout, &o)
	is.True(o.Created) // a send time already past: due at once
	r = c.ok("status", "--json")
	var st service.Status
	decode(t, r.stdout, &st)
	is.Equal(st.Scheduled, int64(1)) // the delayed one only
	r = c.ok("status")
	is.True(strings.Contains(r.stdout, "scheduled, not due yet:")) // the text says it too

	before := rowCounts(t, pool)
	for _, bad := range [][]string{
		{"--delay", "24h"}, // at the expiry (--ttl 24h)
		{"--ttl", "1h", "--delay", "2h"},
		{"--send-at", time.Now().Add(25 * time.Hour).UTC().Format(time.RFC3339)},
		{"--send-at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "--delay", "1m"},
		{"--send-at", "tomorrow"},
		{"--send-at", "2026-12-24 09:00"},
		{"--delay", "0s"},
		{"--delay", "-1m"},
	} {
		args := append([]string{"create", "--user", "u1", "--event-key", "bad", "--body", "b"}, bad...)
		r = c.run("", args...)
		is.Equal(r.code, 2) // bad input
		oneErrorLine(t, r)
		is.True(strings.Contains(r.stderr, "send") || strings.Contains(r.stderr, "delay")) // naming the field
		is.Equal(r.stdout, "")
		t.Logf("%v: %s", bad, strings.TrimSpace(r.stderr))
	}
	is.Equal(rowCounts(t, pool), before) // nothing written

	r = c.run("", "create", "--jsonl", "-", "--delay", "1m")
	is.Equal(r.code, 2) // the send time goes per line with --jsonl
	oneErrorLine(t, r)

	in := strings.Join([]string{
		`{"user":"u1","event_key":"j1","body":"b","send_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`,
		`{"user":"u1","event_key":"j2","body":"b","ttl":"1h","send_at":"` + time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339) + `"}`,
		`{"user":"u1","event_key":"j3","body":"b","send_at":"soon"}`,
	}, "\n")
	r = c.run(in, "create", "--jsonl", "-")
	is.Equal(r.code, 2) // two lines refused
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	is.Equal(len(lines), 3)
	var res [3]jsonlResult
	for i, l := range lines {
		is.NoErr(json.Unmarshal([]byte(l), &res[i]))
	}
	is.True(res[0].Created != nil && res[0].Created.Created) // scheduled
	is.True(strings.Contains(res[1].Error, "send_at"))       // after its expiry
	is.True(strings.Contains(res[2].Error, "send_at"))       // not a time
	var scheduled int64
	is.NoErr(pool.QueryRow(t.Context(), `SELECT count(*) FROM notification WHERE send_at IS NOT NULL`).Scan(&scheduled))
	is.Equal(scheduled, int64(3)) // later, past and j1: the refused lines wrote nothing
}
