package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// syncBuffer is a bytes.Buffer a running process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// process is the binary running in the background.
type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
}

// start runs the binary in the background; it is killed at the end of the test if still running.
func (c notifierCLI) start(args ...string) *process {
	c.t.Helper()
	return c.startWithEnv(nil, args...)
}

// startWithEnv is start with extra environment variables (NAME=value).
func (c notifierCLI) startWithEnv(extra []string, args ...string) *process {
	c.t.Helper()
	cmd := c.command(context.Background(), args...)
	cmd.Env = append(cmd.Env, extra...)
	p := &process{t: c.t, cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start notifier: %v", err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	c.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends sig and waits for the exit code.
func (p *process) stop(sig syscall.Signal) int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("notifier did not exit after %v; stderr:\n%s", sig, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// TestSIGTERMFinishesInFlightCall: SIGTERM during a call lets the call end and its outcome be
// recorded; the worker exits 0 and the task is SENT, not left SENDING.
func TestSIGTERMFinishesInFlightCall(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	push.ScriptAll(fakes.Step{Delay: time.Second}) // accepted at once, answered after 1 s
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.NoErr(err) // preference
	_, _, tasks, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1", Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // notification
	is.Equal(len(tasks), 1) // one task
	taskID := tasks[0].TaskID

	p := c.start("work", "--worker-id", "w-term", "--channel", "push=idempotent,"+push.URL(), "--timeout", "3s", "--poll", "50ms")
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	is.NoErr(push.WaitOutbound(waitCtx, refOf(t, pool, taskID), 1)) // the call is in flight (accepted, not answered)

	is.Equal(p.stop(syscall.SIGTERM), 0) // a clean stop
	task, err := n.Task(ctx, taskID)
	is.NoErr(err)                            // the task reads back
	is.Equal(task.State, delivery.StateSent) // the in-flight call's outcome was recorded
	attempts, err := n.Attempts(ctx, taskID)
	is.NoErr(err)                                            // attempts read back
	is.Equal(len(attempts), 1)                               // one attempt
	is.Equal(attempts[0].Outcome, delivery.OutcomeAccepted)  // accepted
	is.Equal(push.Outbound(refOf(t, pool, taskID)), 1)       // one message
	is.True(strings.Contains(p.stderr.String(), "stopping")) // the shutdown is logged
	is.Equal(p.stdout.String(), "")                          // a long-running worker prints no result
}

// TestMetrics: a worker with --metrics-addr 127.0.0.1:0 logs its address and counts a delivery.
func TestMetrics(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.NoErr(err) // preference
	_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1", Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err) // a due task

	p := c.start("--log-format", "json", "work", "--channel", "push=idempotent,"+push.URL(),
		"--metrics-addr", "127.0.0.1:0", "--poll", "50ms")
	addr := metricsAddr(t, p)
	var body string
	testworld.Eventually(t, 20*time.Second, "the delivery in the metrics", func() bool {
		body = scrape(t, "http://"+addr+"/metrics")
		return strings.Contains(body, `notifier_finish_total{result="SENT"} 1`)
	})
	for _, want := range []string{
		`notifier_calls_total{action="SEND",channel="push",outcome="ACCEPTED"} 1`,
		`notifier_claims_total{channel="push"} 1`,
		`notifier_call_duration_seconds_count{action="SEND",channel="push"} 1`,
		`notifier_parked_total 0`,
	} {
		is.True(strings.Contains(body, want)) // the metric is exposed
	}
	is.Equal(p.stop(syscall.SIGTERM), 0) // a clean stop
}

// metricsAddr waits for a worker's "serving metrics" log line (--log-format json) and returns its address.
func metricsAddr(t *testing.T, p *process) string {
	t.Helper()
	var addr string
	testworld.Eventually(t, 20*time.Second, "the metrics address in the log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving metrics" {
				addr = line.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// TestBadRowDoesNotStopTheQueue: the case a user reported. One attempt row whose attempt number clashes
// with the next attempt of the first task in line (written behind the database's back: its triggers
// refuse it today) made every claim of `work --batch 4` fail, and 0 of the due tasks were delivered.
// Now the claim sets that task aside, says so in an error log line and a metric, and delivers the rest.
func TestBadRowDoesNotStopTheQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	const due = 40
	_, err := pool.Exec(ctx, `
		INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'device-1');
		INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', 'order-' || g, 'shipped', now() + interval '1 hour' FROM generate_series(1, 40) AS g;
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
			SELECT id, 'push', 3, now() FROM notification`)
	is.NoErr(err) // 40 due tasks
	var bad int64
	is.NoErr(pool.QueryRow(ctx, `SELECT min(id) FROM delivery_task`).Scan(&bad)) // first in line
	tx, err := pool.Begin(ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Skipf("writing the clashing row needs a superuser to bypass the triggers: %v", err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES ($1, 1, gen_random_uuid(), 'SEND', 'intruder')`, bad)
	is.NoErr(err)            // the clashing attempt row
	is.NoErr(tx.Commit(ctx)) // is in

	p := c.start("--log-format", "json", "work", "--channel", "push=idempotent,"+push.URL(), "--batch", "4",
		"--poll", "50ms", "--metrics-addr", "127.0.0.1:0")
	addr := metricsAddr(t, p)
	testworld.Eventually(t, 60*time.Second, "every other task to be delivered", func() bool {
		var sent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task WHERE state = 'SENT'`).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		return sent == due-1
	})
	body := scrape(t, "http://"+addr+"/metrics")
	is.Equal(p.stop(syscall.SIGTERM), 0) // a clean stop

	var state, lastError string
	is.NoErr(pool.QueryRow(ctx, `SELECT state, coalesce(last_error, '') FROM delivery_task WHERE id = $1`, bad).Scan(&state, &lastError))
	is.Equal(state, "PENDING")                                                                                                    // the bad task is set aside, nothing else changed
	is.True(strings.Contains(lastError, "SET_ASIDE"))                                                                             // and says why
	is.True(strings.Contains(lastError, "delivery_attempt_task_attempt_no_key"))                                                  // naming the clash
	is.Equal(push.TotalOutbound(), due-1)                                                                                         // every other task delivered, once
	is.True(strings.Contains(body, `notifier_set_aside_total{channel="push"} 1`))                                                 // counted
	is.True(strings.Contains(p.stderr.String(), `"level":"ERROR","msg":"claim refused by the database for this task's own rows`)) // logged as an error
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, %v", resp.StatusCode, err)
	}
	return string(b)
}

// TestHelp: the root and every command document themselves, exit codes and JSON output included.
func TestHelp(t *testing.T) {
	t.Parallel()
	c := notifierCLI{t: t}
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"},
		{"pref", "--help"}, {"pref", "set", "--help"}, {"create", "--help"}, {"cancel", "--help"}, {"work", "--help"},
		{"resolve", "--help"}, {"review", "--help"}, {"show", "--help"}, {"status", "--help"}, {"fake", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", args...)
			is.Equal(r.code, 0)                               // help is not an error
			is.True(strings.Contains(r.stdout, "Exit codes")) // documents the exit codes
			is.True(strings.Contains(r.stdout, "3 nothing changed"))
			is.True(strings.Contains(r.stdout, "JSON")) // and the JSON output
			is.Equal(r.stderr, "")                      // nothing on stderr
		})
	}
}

// TestFake: notifier fake prints its URLs as one JSON line, serves the channels and the control API,
// and stops cleanly on SIGTERM.
func TestFake(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c := notifierCLI{t: t}
	p := c.start("fake")
	var urls fakeOutput
	testworld.Eventually(t, 20*time.Second, "the fake's URLs", func() bool {
		line, ok := strings.CutSuffix(p.stdout.String(), "\n")
		return ok && json.Unmarshal([]byte(line), &urls) == nil
	})
	for _, u := range []string{urls.Push, urls.SMS, urls.None, urls.Control} {
		is.True(strings.HasPrefix(u, "http://127.0.0.1:")) // every server listens
	}

	resp, err := http.Post(urls.Push+"/send", "application/json", strings.NewReader(`{"ref":"task-1","to":"d","body":"b"}`))
	is.NoErr(err) // the push fake answers
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusOK) // and accepts
	var counts fakes.Counts
	is.NoErr(json.Unmarshal([]byte(scrape(t, urls.Control+"/control/push/counts")), &counts)) // the control API answers
	is.Equal(counts.Outbound["task-1"], 1)                                                    // with the push fake's counts

	resp, err = http.Post(urls.Control+"/control/none/script", "application/json", strings.NewReader(`{"ref":"task-2","steps":[{"drop":true}]}`))
	is.NoErr(err) // a drop step through the control API
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusOK) // is accepted
	resp, err = http.Post(urls.None+"/send", "application/json", strings.NewReader(`{"ref":"task-2","to":"d","body":"b"}`))
	if err == nil {
		resp.Body.Close()
	}
	is.True(err != nil) // the connection closed without an answer
	is.NoErr(json.Unmarshal([]byte(scrape(t, urls.Control+"/control/none/counts")), &counts))
	is.Equal(counts.Outbound["task-2"], 1) // after the message was accepted

	is.Equal(p.stop(syscall.SIGTERM), 0)                // a clean stop
	is.Equal(strings.Count(p.stdout.String(), "\n"), 1) // exactly one line on stdout
}

// A finish the server refuses for the task's row fails `work --once` (non-zero exit, the reason on
// stderr, nothing on stdout), as any failed finish does: the call went out, the task stays SENDING and
// is recovered after its lease.
func TestOnceReportsARefusedFinish(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "device-1")
	var created createOutput
	decode(t, c.ok("create", "--user", "u1", "--event-key", "e1", "--body", "b").stdout, &created)
	_, err := pool.Exec(context.Background(), `
		CREATE FUNCTION refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'check_violation';
		END $$;
		CREATE TRIGGER refuse_row BEFORE UPDATE ON delivery_task FOR EACH ROW
			WHEN (OLD.state = 'SENDING' AND NEW.state <> 'SENDING') EXECUTE FUNCTION refuse_row()`)
	is.NoErr(err) // trigger installed

	r := c.run("", "work", "--once", "--worker-id", "w1", "--channel", "push=IDEMPOTENT,"+push.URL())
	is.Equal(r.code, 1)                                        // the finish failed: a runtime error
	is.True(strings.Contains(r.stderr, "refused by the test")) // with the server's reason
	is.Equal(r.stdout, "")                                     // and no result
	taskID := created.Tasks[0].TaskID
	is.Equal(push.Outbound(refOf(t, pool, taskID)), 1) // the call went out
	task, err := service.NewNotifier(pool).Task(context.Background(), taskID)
	is.NoErr(err)
	is.Equal(task.State, delivery.StateSending) // left to lease expiry
}

// TestLogLinesNameEachKeyOnce: a worker's log lines, JSON and text, never repeat a key. The CALLED line
// named the provider's message id "msg", the key of the event's own name, so `jq .msg` (and any JSON
// reader that keeps the last of two keys) found no CALLED line at all.
func TestLogLinesNameEachKeyOnce(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err)
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			is := is.New(t)
			_, _, _, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-" + format, Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
			is.NoErr(err) // a due task
			r := c.run("", "--log-format", format, "work", "--once", "--channel", "push=idempotent,"+push.URL())
			is.Equal(r.code, 0) // delivered
			called := 0
			for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
				logKeys := jsonLogKeys
				if format == "text" {
					logKeys = textLogKeys
				}
				keys, values := logKeys(t, line)
				seen := map[string]bool{}
				for _, k := range keys {
					if seen[k] {
						t.Fatalf("key %q twice in %s", k, line)
					}
					seen[k] = true
				}
				if values["msg"] == "CALLED" {
					called++
					is.True(strings.HasPrefix(values["provider_msg_id"], "push-")) // the provider's id, under its own name
				}
			}
			is.Equal(called, 1) // the call's line, found by its msg
		})
	}
}

// jsonLogKeys are the keys of a JSON log line in order, repeats included (encoding/json keeps only
// the last of two), and the last value of each (a string's text, another value as written).
func jsonLogKeys(t *testing.T, line string) ([]string, map[string]string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s (%v)", line, err)
	}
	var keys []string
	values := map[string]string{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		value := string(raw)
		_ = json.Unmarshal(raw, &value) // a string's text; other values stay as written
		keys, values[k.(string)] = append(keys, k.(string)), value
	}
	return keys, values
}

// textLogKeys are the keys of a log/slog text line (key=value, a value quoted when it needs it) in
// order, repeats included, and the last value of each.
func textLogKeys(t *testing.T, line string) ([]string, map[string]string) {
	t.Helper()
	var keys []string
	values := map[string]string{}
	for rest := line; rest != ""; {
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 {
			t.Fatalf("not key=value at %q in %s", rest, line)
		}
		key, v := rest[:eq], rest[eq+1:]
		var value string
		if strings.HasPrefix(v, `"`) {
			end := 1
			for end < len(v) && v[end] != '"' {
				if v[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(v) {
				t.Fatalf("unterminated value in %s", line)
			}
			var err error
			if value, err = strconv.Unquote(v[:end+1]); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			v = v[end+1:]
		} else {
			value, v, _ = strings.Cut(v, " ")
		}
		keys, values[key] = append(keys, key), value
		rest = strings.TrimPrefix(v, " ")
	}
	return keys, values
}
