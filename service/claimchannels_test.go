package service_test

import (
	"testing"

	"github.com/matryer/is"
)

// A claim over several channels takes at most its limit in all: each channel is asked for what the
// channels before it left (lockDue), and a claim that filled its limit asks no further channel.
// Successive claims start with the next channel, so that one channel's backlog does not hold back
// another's.
func TestClaimSharesItsLimitAmongChannels(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "p-", 5)
	e.backlog("u2", "sms", "s-", 5)
	d := e.dispatcher(dcfg{})
	claim := func(limit int) map[string]int { // tasks claimed per channel
		attempts, settled, err := d.ClaimBatch(e.ctx, limit)
		is.NoErr(err)
		is.Equal(len(settled), 0)
		perChannel := map[string]int{}
		for _, a := range attempts {
			perChannel[a.Channel]++
		}
		return perChannel
	}

	first := claim(7)
	is.Equal(first["push"]+first["sms"], 7)          // the limit, across both channels
	is.True(first["push"] == 5 || first["sms"] == 5) // one channel whole, the rest from the other
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENDING'`), int64(7))

	e.backlog("u3", "push", "p2-", 4)
	e.backlog("u4", "sms", "s2-", 4)
	second := claim(4)
	third := claim(4)
	is.Equal(second["push"]+second["sms"], 4)
	is.Equal(third["push"]+third["sms"], 4)
	is.True(second["push"] == 4 || second["sms"] == 4) // each claim starts with one channel...
	is.True(second["push"] != third["push"])           // ...and the next with the other
}
