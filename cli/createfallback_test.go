package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestCreateFallback: create --fallback makes one task per chain channel the user has enabled, shows
// their places in the chain, and refuses a channel named twice or --fallback with --channels with exit
// 2, writing nothing; the same through --jsonl's "fallback".
func TestCreateFallback(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	c.ok("pref", "set", "--user", "u1", "--channel", "sms", "--address", "+15550100")

	r := c.ok("create", "--user", "u1", "--event-key", "e1", "--body", "b", "--fallback", "sms,email,push")
	var o createOutput
	decode(t, r.stdout, &o)
	is.True(o.Created)
	is.Equal(taskChannels(o), "push,sms")                    // one task per enabled chain channel
	is.Equal(o.ChannelsWithoutPreference, []string{"email"}) // named, no preference
	var due, unreleased string
	is.NoErr(pool.QueryRow(t.Context(), `SELECT string_agg(channel, ',' ORDER BY fallback_position) FILTER (WHERE next_attempt_at IS NOT NULL),
		string_agg(channel, ',' ORDER BY fallback_position) FILTER (WHERE next_attempt_at IS NULL) FROM delivery_task`).Scan(&due, &unreleased))
	is.Equal(due, "sms")         // the first of the chain is due
	is.Equal(unreleased, "push") // the next waits for it

	shown := c.ok("show", "--user", "u1", "--event-key", "e1")
	is.True(strings.Contains(shown.stdout, `"fallback_position":2`)) // show names each task's place

	before := rowCounts(t, pool)
	for _, bad := range [][]string{
		{"--fallback", "push,sms,push"},
		{"--fallback", "push", "--channels", "sms"},
		{"--fallback", "Push"},
		{"--fallback", ""},
	} {
		r = c.run("", append([]string{"create", "--user", "u1", "--event-key", "bad", "--body", "b"}, bad...)...)
		is.Equal(r.code, 2) // bad input
		oneErrorLine(t, r)
		is.True(strings.Contains(r.stderr, "fallback")) // naming the field
		is.Equal(r.stdout, "")
	}
	is.Equal(rowCounts(t, pool), before) // nothing written

	in := strings.Join([]string{
		`{"user":"u1","event_key":"j1","body":"b","fallback":["push","sms"]}`,
		`{"user":"u1","event_key":"j2","body":"b","fallback":["sms","sms"]}`,
		`{"user":"u1","event_key":"j3","body":"b","fallback":[]}`,
	}, "\n")
	r = c.run(in, "create", "--jsonl", "-")
	is.Equal(r.code, 2) // two lines refused
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	is.Equal(len(lines), 3)
	var res [3]jsonlResult
	for i, l := range lines {
		is.NoErr(json.Unmarshal([]byte(l), &res[i]))
	}
	is.Equal(taskChannels(*res[0].Created), "push,sms")
	is.True(strings.Contains(res[1].Error, "named twice"))
	is.True(strings.Contains(res[2].Error, `"fallback" is empty`))
}
