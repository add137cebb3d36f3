package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service"
)

// TestStatusShowsAccountPauses: a channel the worker's query paused for an account state
// (ChannelPauseRefused, as a finish writes it) is in notifier status, run by the operator role: in JSON
// with its cause, since when, the backoff and the next probe; in the table with the cause quoted, so
// that the provider's text cannot send control sequences to the operator's terminal. Once a probe ends
// the pause, status shows none.
func TestStatusShowsAccountPauses(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	c, pool := newCLI(t)
	operator := c.loginAs(pool, service.RoleOperator)
	const cause = "401 code 20003: \"Authenticate\" \x1b[2J"
	q := dbgen.New(pool)
	row, err := q.ChannelPauseRefused(ctx, dbgen.ChannelPauseRefusedParams{Channel: "sms", Cause: cause,
		StartSeconds: 30, HoldSeconds: 30, CapSeconds: 300})
	is.NoErr(err)
	is.True(row.Began) // the refusal paused sms

	var st service.Status
	decode(t, operator.ok("status", "--json").stdout, &st)
	is.Equal(len(st.ChannelPauses), 1) // status shows the pause
	p := st.ChannelPauses[0]
	is.Equal(p.Channel, "sms")                    // of sms
	is.Equal(p.Cause, cause)                      // with its cause, verbatim for scripts
	is.True(!p.Since.IsZero())                    // since when
	is.True(p.PausedFor >= 0 && p.PausedFor < 30) // paused just now
	is.Equal(p.Backoff, 30.0)                     // the first wait between probes
	is.True(p.NextProbe > 0 && p.NextProbe <= 30) // the first probe is still to come
	table := operator.ok("status").stdout
	is.True(strings.Contains(table, "PAUSED FOR ITS ACCOUNT SINCE")) // a table for people
	var line string
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, "sms ") {
			line = l
		}
	}
	if line == "" {
		t.Logf("status:\n%s", table)
	}
	is.True(strings.Contains(line, " ago)"))                                          // since when, and how long
	is.True(strings.Contains(line, " 30s "))                                          // the backoff
	is.True(strings.Contains(line, " in 30s ") || strings.Contains(line, " in 29s ")) // until the next probe
	is.True(strings.Contains(line, `"401 code 20003: \"Authenticate\" \x1b[2J"`))     // the cause, quoted
	is.True(!strings.Contains(table, "\x1b"))                                         // no raw control character

	ended, err := q.ChannelPauseEnd(ctx, "sms")
	is.NoErr(err)
	is.Equal(len(ended), 1) // a probe ended the pause
	r := operator.ok("status", "--json")
	is.True(strings.Contains(r.stdout, `"channel_pauses":[]`)) // none, as a list for scripts
	is.True(!strings.Contains(operator.ok("status").stdout, "PAUSED FOR ITS ACCOUNT"))
}
