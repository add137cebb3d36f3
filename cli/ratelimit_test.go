package cli

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
)

// TestRateLimitSharedByWorkerProcesses: three `notifier work` processes share one channel's rate limit
// (rate_limit = "20/s" in their channels file) against a fake that enforces 20/s itself and answers
// 429 beyond it. Together they deliver 200 tasks at 20/s (within 10%, measured from the fake's own
// acceptance times after the initial burst), and the fake never answers 429: every task is SENT with
// one attempt.
//
// The workers' burst is 10, the fake's one second's worth (20): a task's call reaches the fake a few
// milliseconds after its claim took the token, and the slack of 10 absorbs that jitter. The first 10
// calls go out at once (the bucket starts full), so the rate is measured from the 10th acceptance on.
func TestRateLimitSharedByWorkerProcesses(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	ctx := context.Background()
	const (
		rate  = 20
		burst = 10
		tasks = 200 // about ten seconds at the rate
	)
	push := startFake(t, "push")
	push.SetRateLimit(rate)
	_, err := pool.Exec(ctx, `
		INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'device-1');
		INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'order-' || g, 'shipped', now() + interval '1 hour' FROM generate_series(1, 200) AS g;
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
			SELECT id, 'push', 3, now() FROM notification`)
	is.NoErr(err) // 200 due tasks
	file := writeChannels(t, `
[channels.push]
kind = "http"
mode = "idempotent"
url = "`+push.URL()+`"
rate_limit = "`+strconv.Itoa(rate)+`/s"
burst = `+strconv.Itoa(burst)+`
`)
	var workers []*process
	for i := range 3 {
		workers = append(workers, c.start("--log-format", "json", "work", "--channels-file", file,
			"--worker-id", "w"+strconv.Itoa(i), "--poll", "50ms", "--metrics-addr", "127.0.0.1:0"))
	}
	addrs := make([]string, len(workers))
	for i, p := range workers {
		addrs[i] = metricsAddr(t, p)
	}
	testworld.Eventually(t, 90*time.Second, "every task delivered or given up", func() bool {
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task WHERE state IN ('PENDING', 'SENDING')`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		return open == 0
	})
	var limited, paused, claims float64
	for _, addr := range addrs {
		body := scrape(t, "http://"+addr+"/metrics")
		limited += metricValue(body, `notifier_rate_limited_total{channel="push"}`)
		paused += metricValue(body, `notifier_rate_paused_total{channel="push"}`)
		claims += metricValue(body, `notifier_claims_total{channel="push"}`)
	}
	for _, p := range workers {
		is.Equal(p.stop(syscall.SIGTERM), 0) // a clean stop
	}

	times := push.AcceptedAt()
	t.Logf("%d accepted, %d answered 429", len(times), push.TotalThrottled())
	is.Equal(len(times), tasks) // each task accepted once
	steady := float64(tasks-burst) / times[tasks-1].Sub(times[burst-1]).Seconds()
	t.Logf("%d deliveries at %.2f/s after the burst (%.2fs in all); %d answered 429; %v claims held back by the bucket",
		tasks, steady, times[tasks-1].Sub(times[0]).Seconds(), push.TotalThrottled(), limited)
	is.True(steady >= 0.9*rate && steady <= 1.1*rate) // the limit's rate, shared by the three processes
	is.Equal(push.TotalThrottled(), 0)                // the fake never had to refuse
	is.Equal(push.TotalSends(), tasks)                // one request per task
	is.True(limited > 0)                              // the workers were held back by the bucket, and said so
	is.Equal(paused, 0.0)                             // no 429, no pause
	is.Equal(claims, float64(tasks))                  // 200 claims in all, none twice
	var sent, attempts int
	is.NoErr(pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM delivery_task WHERE state = 'SENT'),
		(SELECT count(*) FROM delivery_attempt)`).Scan(&sent, &attempts))
	is.Equal(sent, tasks)     // every task SENT
	is.Equal(attempts, tasks) // at the first attempt

	var st service.Status
	decode(t, c.ok("status", "--json").stdout, &st)
	is.Equal(len(st.RateLimits), 1) // status shows the bucket
	is.Equal(st.RateLimits[0], service.Bucket{Channel: "push", PerSecond: rate, Burst: burst,
		Tokens: st.RateLimits[0].Tokens}) // as configured
	table := c.ok("status").stdout
	is.True(strings.Contains(table, "RATE/S")) // and in the table for people
	row := false
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		row = row || len(f) == 5 && f[0] == "push" && f[1] == "20" && f[2] == "10" && f[4] == "-"
	}
	if !row {
		t.Logf("status:\n%s", table)
	}
	is.True(row) // push, 20/s, burst 10, some tokens, not paused
}

// metricValue is the value of one sample line of a Prometheus text exposition, 0 when absent.
func metricValue(body, sample string) float64 {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

// A rate limit the worker refuses at start, with exit 2 and one line naming the channel: a bad rate,
// and a burst smaller than what the bucket gains during one --poll (a worker that found no token waits
// --poll, so the channel would run below its limit). Nothing is claimed.
func TestWorkRateLimitErrors(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	push := startFake(t, "push")
	before := rowCounts(t, pool)
	pushTable := "[channels.push]\nkind = \"http\"\nmode = \"idempotent\"\nurl = \"" + push.URL() + "\"\n"
	for _, tc := range []struct {
		name string
		toml string
		args []string
		want []string
	}{
		{"zero rate", pushTable + "rate_limit = \"0/s\"\n", []string{"--once"}, []string{`channel "push"`, `rate_limit "0/s": not positive`}},
		{"burst without rate", pushTable + "burst = 5\n", []string{"--once"}, []string{`channel "push"`, "burst: applies only with rate_limit"}},
		{"burst under one poll", pushTable + "rate_limit = \"1000/s\"\nburst = 10\n", []string{"--poll", "200ms"},
			[]string{`channel "push"`, "burst 10 is less than one --poll 200ms", "at least 200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", append([]string{"work", "--channels-file", writeChannels(t, tc.toml)}, tc.args...)...)
			is.Equal(r.code, 2) // bad configuration
			oneErrorLine(t, r)
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Fatalf("stderr %q does not contain %q", r.stderr, w)
				}
			}
		})
	}
	is := is.New(t)
	is.Equal(rowCounts(t, pool), before) // nothing written
	is.Equal(push.TotalSends(), 0)       // nothing sent
	// --once does not poll: the same limit is accepted, and its bucket written and logged at start.
	file := writeChannels(t, pushTable+"rate_limit = \"1000/s\"\nburst = 10\n")
	r := c.run("", "work", "--once", "--channels-file", file)
	is.Equal(r.code, 0)                                                          // valid
	is.True(strings.Contains(r.stdout, `"result":"NOTHING"`))                    // nothing due
	is.True(strings.Contains(r.stderr, `msg="rate limit"`))                      // the bucket, logged at start
	is.True(strings.Contains(r.stderr, `channel=push per_second=1000 burst=10`)) // with the limit
}
