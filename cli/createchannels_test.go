package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// taskChannels is the channels of create's tasks, joined by commas.
func taskChannels(o createOutput) string {
	var names []string
	for _, t := range o.Tasks {
		names = append(names, t.Channel)
	}
	return strings.Join(names, ",")
}

// TestCreateChannels: create --channels makes tasks only on the named channels the user has enabled,
// names the ones without an enabled preference, and refuses a bad name with exit 2, writing nothing;
// the same through --jsonl's "channels".
func TestCreateChannels(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	c.ok("pref", "set", "--user", "u1", "--channel", "sms", "--address", "+15550100")
	c.ok("pref", "set", "--user", "u1", "--channel", "email", "--address", "u1@example.com", "--enabled=false")

	r := c.ok("create", "--user", "u1", "--event-key", "otp-1", "--body", "code 123", "--channels", "sms")
	var o createOutput
	decode(t, r.stdout, &o)
	is.True(o.Created)
	is.Equal(taskChannels(o), "sms")                                    // only the named channel, though push is enabled too
	is.True(!strings.Contains(r.stdout, "channels_without_preference")) // none missing: no field

	r = c.ok("create", "--user", "u1", "--event-key", "otp-2", "--body", "code 456", "--channels", "push, sms,email,fax")
	o = createOutput{}
	decode(t, r.stdout, &o)
	is.Equal(taskChannels(o), "push,sms")                           // the named ones the user enabled
	is.Equal(o.ChannelsWithoutPreference, []string{"email", "fax"}) // disabled, and absent
	is.True(strings.Contains(r.stdout, `"channels_without_preference":["email","fax"]`))

	r = c.ok("create", "--user", "u1", "--event-key", "every", "--body", "hello")
	is.True(!strings.Contains(r.stdout, "channels_without_preference")) // no names: no field
	o = createOutput{}
	decode(t, r.stdout, &o)
	is.Equal(taskChannels(o), "push,sms") // every enabled channel

	before := rowCounts(t, pool)
	for _, bad := range []string{"SMS", "push,", "", "push,s ms", strings.Repeat("x", 33)} {
		r = c.run("", "create", "--user", "u1", "--event-key", "bad", "--body", "b", "--channels", bad)
		is.Equal(r.code, 2)                             // bad input
		oneErrorLine(t, r)                              // one line
		is.True(strings.Contains(r.stderr, "channels")) // naming the flag's field
		is.Equal(r.stdout, "")
	}
	is.Equal(rowCounts(t, pool), before) // nothing written

	r = c.run("", "create", "--jsonl", "-", "--channels", "sms")
	is.Equal(r.code, 2) // --channels goes per line with --jsonl
	oneErrorLine(t, r)

	in := strings.Join([]string{
		`{"user":"u1","event_key":"j1","body":"b","channels":["sms","fax"]}`,
		`{"user":"u1","event_key":"j2","body":"b","channels":["Fax"]}`,
		`{"user":"u1","event_key":"j3","body":"b","channels":[]}`,
		`{"user":"u1","event_key":"j4","body":"b"}`,
	}, "\n")
	r = c.run(in, "create", "--jsonl", "-")
	is.Equal(r.code, 2) // two lines refused
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	is.Equal(len(lines), 4)
	var res [4]jsonlResult
	for i, l := range lines {
		is.NoErr(json.Unmarshal([]byte(l), &res[i]))
	}
	is.Equal(taskChannels(*res[0].Created), "sms")              // the named, enabled one
	is.Equal(res[0].ChannelsWithoutPreference, []string{"fax"}) // and the one without a preference
	is.True(strings.Contains(res[1].Error, "channels"))         // a bad name refuses its line
	is.True(strings.Contains(res[2].Error, "channels"))         // so does an empty list
	is.Equal(taskChannels(*res[3].Created), "push,sms")         // no channels: every enabled one
	is.Equal(res[3].ChannelsWithoutPreference, []string(nil))   // and no field
	var refused int64
	is.NoErr(pool.QueryRow(t.Context(), `SELECT count(*) FROM notification WHERE event_key IN ('j2', 'j3')`).Scan(&refused))
	is.Equal(refused, int64(0)) // the refused lines wrote nothing
}
