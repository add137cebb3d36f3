package service_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// accountPauseWorker is a dispatcher whose push route sends the bearer credential token, with a
// short probe backoff (100 ms doubled up to 400 ms), which tells log of the pauses and resumes it writes.
func accountPauseWorker(t *testing.T, e *env, worker, token string, log *pauseLog) *dispatcher {
	t.Helper()
	d := e.dispatcher(dcfg{worker: worker, configure: func(cfg *service.DispatcherConfig) {
		client, err := httpchannel.New(e.push.URL(), httpchannel.Options{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		route := cfg.Routes["push"]
		route.Client = client
		cfg.Routes["push"] = route
		cfg.AccountPauseStart, cfg.AccountPauseMax = 100*time.Millisecond, 400*time.Millisecond
		cfg.Observer = testObserver{
			accountPaused: func(p service.AccountPauseEvent) { log.add(p.Channel+" paused: "+p.Cause, p.Began, p.Err) },
			accountResumed: func(r service.AccountResumeEvent) {
				log.add(r.Channel+" resumed after: "+r.Cause, true, r.Err)
			},
		}
	}})
	return d
}

type pauseLog struct {
	mu     sync.Mutex
	began  []string // pauses begun and ended
	probes int      // refused probes
	errs   []error
}

func (l *pauseLog) add(line string, began bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, err)
	}
	if began {
		l.began = append(l.began, line)
	} else {
		l.probes++
	}
}

// A credential rotation mid-queue: 50 tasks on push, the endpoint stops accepting our credential after
// 10 were delivered. The channel pauses for every worker (status shows it and its cause), probes go one
// at a time with backoff, no task fails and no refusal counts against a task's budget; once the
// credential works again the channel resumes by itself and every task is delivered exactly once.
func TestAccountRefusedPausesChannelUntilCredentialWorks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.backlog("u1", "push", "rot-", 50) // max_attempts 3 each
	e.push.SetCredential("key-1")
	log := &pauseLog{} // what both workers are told, as their logs would show it
	w1 := accountPauseWorker(t, e, "w-1", "key-1", log)
	w2 := accountPauseWorker(t, e, "w-2", "key-1", log)
	sent := func() int64 { return e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`) }

	for sent() < 10 { // one task per cycle, whatever NOTIFIER_TEST_BATCH says, so that exactly 10 go first
		res, err := runBatch(e.ctx, w1, 1)
		is.NoErr(err)
		is.Equal(len(res), 1)
		is.Equal(res[0].Kind, service.ResultSent) // the credential works
	}
	e.push.SetCredential("key-2") // rotated at the endpoint; the workers still send key-1

	// Both workers run their cycles; the first refusal pauses push for both, and from then on only
	// one probe at a time goes out, further apart each time.
	cycle := func() {
		for _, w := range []*dispatcher{w1, w2} {
			if _, err := runBatch(e.ctx, w, 5); err != nil {
				t.Fatal(err)
			}
		}
	}
	probes := func() int { log.mu.Lock(); defer log.mu.Unlock(); return log.probes }
	testworld.Eventually(t, 10*time.Second, "three probes while paused", func() bool { cycle(); return probes() >= 3 })
	is.True(e.push.RefusedCredential() <= 5+3+2) // the first batch, then one probe at a time (a probe may be in flight at both)
	pauses, err := e.n.ChannelPauses(e.ctx)
	is.NoErr(err)
	is.Equal(len(pauses), 1)                                                                                      // status shows the pause
	is.Equal(pauses[0].Channel, "push")                                                                           // of push
	is.True(strings.Contains(pauses[0].Cause, "credential"))                                                      // and its cause
	is.True(pauses[0].Backoff > 0.1)                                                                              // backed off from its start
	is.True(pauses[0].PausedFor > 0 && pauses[0].PausedFor < 600)                                                 // paused since the first refusal, by the database's clock
	is.Equal(sent(), int64(10))                                                                                   // nothing delivered meanwhile
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'FAILED'`), int64(0))                     // no task written off
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE needs_review`), int64(0))                         // none parked
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE attempt_count - account_refusals > 1`), int64(0)) // no budget spent on refusals
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt WHERE outcome = 'ACCOUNT_REFUSED'`),
		int64(e.push.RefusedCredential())) // each refusal is an attempt row
	is.Equal(e.scalar(`SELECT sum(account_refusals) FROM delivery_task`), int64(e.push.RefusedCredential())) // each refunded

	e.push.SetCredential("key-1") // the operator fixes the credential: the endpoint accepts ours again
	testworld.Eventually(t, 10*time.Second, "every task sent after the fix", func() bool { cycle(); return sent() == 50 })
	pauses, err = e.n.ChannelPauses(e.ctx)
	is.NoErr(err)
	is.Equal(len(pauses), 0)                // resumed by itself, on a probe
	is.Equal(e.push.TotalOutbound(), 50)    // every task delivered
	is.Equal(e.push.MaxOutboundPerRef(), 1) // exactly once
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state <> 'SENT'`), int64(0))
	log.mu.Lock()
	defer log.mu.Unlock()
	is.Equal(len(log.errs), 0)
	is.Equal(len(log.began), 2) // one pause logged, one resume
	is.True(strings.HasPrefix(log.began[0], "push paused: HTTP 401"))
	is.True(strings.HasPrefix(log.began[1], "push resumed after: HTTP 401"))
	is.True(log.probes >= 3) // refused probes doubled the backoff
}

// Tasks that expire while their channel is paused end as any other (FAILED, TTL_EXPIRED, never called),
// one per claim: a probe task settled without a call frees the probe slot, so the next claim probes
// again at once and the first live task behind them is the probe that ends the pause.
func TestAccountPauseSettlesExpiredTasksWithoutHoldingTheProbe(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	// Three tasks whose notification expired, due first; one live task behind them.
	_, err := e.pool.Exec(e.ctx, `WITH n AS (
		INSERT INTO notification (user_id, event_key, body, created_at, expires_at)
		SELECT 'u1', 'old-' || g, 'body', now() - interval '2 hours', now() - interval '1 hour' FROM generate_series(1, 3) AS g
		RETURNING id)
	INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
	SELECT id, 'push', 3, now() - interval '1 minute' FROM n`)
	is.NoErr(err)
	e.backlog("u1", "push", "live-", 1)
	// push is paused, its probe due now; a probe holds the slot for 30 s, longer than this test.
	_, err = e.pool.Exec(e.ctx, `INSERT INTO channel_pause (channel, cause, backoff_seconds, probe_after, probe_hold_seconds)
		VALUES ('push', 'HTTP 401: credential rejected', 2, now(), 30)`)
	is.NoErr(err)
	e.push.SetCredential("key-1")
	w := accountPauseWorker(t, e, "w-1", "key-1", &pauseLog{})

	for range 4 { // one task per claim while paused
		_, err := runBatch(e.ctx, w, 5)
		is.NoErr(err)
	}
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt WHERE outcome = 'TTL_EXPIRED'`), int64(3)) // the expired ones ended, uncalled
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'FAILED'`), int64(3))
	is.Equal(e.push.TotalOutbound(), 1)                                // the live task was the probe, delivered
	is.Equal(e.scalar(`SELECT count(*) FROM channel_pause`), int64(0)) // and its answer ended the pause
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`), int64(1))
}
