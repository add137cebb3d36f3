package cli

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/receipts"
	"github.com/notifierhq/notifier/service/webhook"
)

func demoCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "demo",
		Usage:     "run the whole job end to end against fake channels and print a report",
		UsageText: "notifier demo [--timeout 40s]",
		Description: `Meant for a throwaway database (sh internal/tools/just demo starts one): it writes demo users and
notifications. In about fifteen seconds it
  1. starts the fake push (idempotent), sms (queryable) and none channels in this process;
  2. sets preferences for four users, one of them with push switched off;
  3. submits twelve events, each three times at once (36 creates, 12 notifications);
  4. makes the first call of one task per channel accept and then answer too late (accept-then-timeout);
  5. runs two "notifier work" processes until every task is settled or parked, then stops them with SIGTERM;
  6. prints a report: per task its state, the outcome of every attempt, and how many messages the fake
     channel really sent.
  7. plays the none channel's provider: a signed receipt (Standard Webhooks) for the parked task,
     received by notifier receipts' handler, settles it as SENT with the receipt as its evidence.
It fails (exit 1) unless the report shows a resend that the channel recognised (ACCEPTED_REPLAY), a
query that found the message (QUERY_FOUND), a parked task, no duplicate notification, and the receipt
settling the parked task.

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "timeout", Value: 40 * time.Second, Usage: "give up if the tasks are not settled by then"},
		},
		Action: func(c *cli.Context) error { return runDemo(c.Context, e, c.Duration("timeout")) },
	}
}

// demoTask is one delivery task of the demo, with what the report needs.
type demoTask struct {
	service.TaskRef
	user, event string
}

func runDemo(ctx context.Context, e *env, timeout time.Duration) error {
	pool, err := e.workerPool(8)
	if err != nil {
		return err
	}
	defer pool.Close()
	n := service.NewNotifier(pool)
	out := e.stdout

	channels := map[string]*fakes.Channel{}
	for _, kind := range []fakes.Kind{fakes.Push, fakes.SMS, fakes.None} {
		ch, err := fakes.StartOn(kind, "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ch.Close()
		channels[string(kind)] = ch
	}
	fmt.Fprintf(out, "== fake channels: push (idempotent) %s, sms (queryable) %s, none %s\n",
		channels["push"].URL(), channels["sms"].URL(), channels["none"].URL())

	prefs := []struct {
		user, channel string
		enabled       bool
	}{
		{"alice", "push", true}, {"alice", "sms", true},
		{"bob", "push", true}, {"bob", "none", true},
		{"carol", "sms", true}, {"carol", "none", true},
		{"dave", "push", false}, {"dave", "sms", true},
	}
	for _, p := range prefs {
		ctx, cancel := e.dbContext(ctx)
		_, err := n.SetPreference(ctx, p.user, p.channel, p.user+"@"+p.channel, p.enabled)
		cancel()
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "== preferences: alice push+sms, bob push+none, carol sms+none, dave sms (push switched off)")

	run := time.Now().UTC().Format("150405.000")
	tasks, created, submissions, err := demoCreates(ctx, e, n, run)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "== %d submissions (each event 3 times at once): %d notifications created, %d duplicates answered created=false, %d tasks\n",
		submissions, created, submissions-created, len(tasks))

	injected := map[string]int64{}
	for _, t := range tasks {
		if _, done := injected[t.Channel]; !done {
			injected[t.Channel] = t.TaskID
			channels[t.Channel].ScriptSend(t.Ref, fakes.Step{Delay: 1500 * time.Millisecond})
		}
	}
	fmt.Fprintf(out, "== accept-then-timeout injected on task %d (push), %d (sms), %d (none): the fake accepts, then answers after 1.5s; workers wait 500ms\n",
		injected["push"], injected["sms"], injected["none"])

	workers, err := startDemoWorkers(e, channels)
	if err != nil {
		return err
	}
	settled := waitSettled(ctx, e, n, tasks, timeout)
	stopErr := stopDemoWorkers(workers)

	report, err := demoReport(ctx, e, n, tasks, channels)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\n== report")
	if err := report.print(out); err != nil {
		return err
	}
	if err := errors.Join(settled, stopErr); err != nil {
		return err
	}
	if err := report.check(created); err != nil {
		return err
	}
	if err := demoReceipt(ctx, e, n, report); err != nil {
		return err
	}
	return demoIntake(ctx, e, n, channels, run, timeout)
}

// demoReceipt plays the provider of the none channel telling us, in a signed callback, that it
// delivered the message of a parked task: notifier receipts' handler (in this process, on a key made for
// the demo) records the receipt and the task becomes SENT, no human needed.
func demoReceipt(ctx context.Context, e *env, n *service.Notifier, rows demoReportRows) error {
	var (
		parked int64
		ref    string
	)
	for _, r := range rows {
		if r.task.NeedsReview {
			parked, ref = r.TaskID, r.Ref
			break
		}
	}
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	srv := httptest.NewServer(receipts.NewHandler(n, receipts.Config{WebhookKeys: [][]byte{key}, Logger: e.log}))
	defer srv.Close()
	body := fmt.Sprintf(`{"type":"message.delivered","data":{"ref":"%s"}}`, delivery.IdempotencyKey(ref))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/receipts/standard-webhooks", strings.NewReader(body))
	if err != nil {
		return err
	}
	id, ts := "demo-receipt-"+strconv.FormatInt(parked, 10), time.Now().Unix()
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", webhook.Sign(key, id, ts, []byte(body)))
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("demo: post the receipt: %w", err)
	}
	resp.Body.Close()
	dctx, cancel := e.dbContext(ctx)
	defer cancel()
	task, err := n.Task(dctx, parked)
	if err != nil {
		return err
	}
	attempts, err := n.Attempts(dctx, parked)
	if err != nil {
		return err
	}
	steps := make([]string, len(attempts))
	for i, a := range attempts {
		steps[i] = string(a.Action) + ":" + string(a.Outcome)
	}
	fmt.Fprintf(e.stdout, "\n== a receipt: the none channel's provider says, in a signed Standard Webhooks callback, that it\n"+
		"   delivered task %d's message (HTTP %d). The parked task is settled by that evidence, no human needed:\n"+
		"   task %d: %s, attempts %s\n", parked, resp.StatusCode, parked, task.State, strings.Join(steps, " -> "))
	if resp.StatusCode != http.StatusOK || task.State != delivery.StateSent {
		return fmt.Errorf("demo: the receipt did not settle task %d (HTTP %d, state %s)", parked, resp.StatusCode, task.State)
	}
	return nil
}

// demoCreates submits every event three times concurrently, as a retrying client would.
func demoCreates(ctx context.Context, e *env, n *service.Notifier, run string) ([]demoTask, int, int, error) {
	var (
		mu      sync.Mutex
		tasks   []demoTask
		created int
		wg      sync.WaitGroup
		errs    []error
	)
	users := []string{"alice", "bob", "carol", "dave"}
	submissions := 0
	for i := range 3 {
		for _, user := range users {
			event := fmt.Sprintf("order-%d-shipped-%s", 1001+i, run)
			for range 3 {
				submissions++
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := e.dbContext(ctx)
					defer cancel()
					_, isNew, refs, err := n.Create(ctx, service.CreateRequest{UserID: user, EventKey: event, Body: fmt.Sprintf("Hello %s, order %d has shipped", user, 1001+i), TTL: time.Minute, MaxAttempts: 3})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					if isNew {
						created++
						for _, r := range refs {
							tasks = append(tasks, demoTask{TaskRef: r, user: user, event: event})
						}
					}
				}()
			}
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, 0, 0, errs[0]
	}
	sortTasks(tasks)
	return tasks, created, submissions, nil
}

func sortTasks(tasks []demoTask) {
	slices.SortFunc(tasks, func(a, b demoTask) int { return cmp.Compare(a.TaskID, b.TaskID) })
}

// startDemoWorkers runs two "notifier work" processes of this very binary, their logs prefixed on stderr.
func startDemoWorkers(e *env, channels map[string]*fakes.Channel) ([]*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary: %w", err)
	}
	var cmds []*exec.Cmd
	for _, id := range []string{"demo-w1", "demo-w2"} {
		cmd := exec.Command(self, "work", "--worker-id", id,
			"--channel", "push=idempotent,"+channels["push"].URL(),
			"--channel", "sms=queryable,"+channels["sms"].URL(),
			"--channel", "none=none,"+channels["none"].URL(),
			"--timeout", "500ms", "--lease", "3s", "--backoff", "300ms", "--poll", "100ms")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+e.dbURL) // not on the command line, where ps shows it
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		cmd.Stdout = io.Discard
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start worker %s: %w", id, err)
		}
		go prefixLines(e.stderr, "["+id+"] ", stderr)
		cmds = append(cmds, cmd)
	}
	fmt.Fprintln(e.stdout, "== two worker processes started (demo-w1, demo-w2); their logs go to stderr")
	return cmds, nil
}

var stderrMu sync.Mutex

func prefixLines(w io.Writer, prefix string, r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		stderrMu.Lock()
		fmt.Fprintln(w, prefix+sc.Text())
		stderrMu.Unlock()
	}
}

// stopDemoWorkers sends SIGTERM, as systemd would, and expects a clean exit.
func stopDemoWorkers(cmds []*exec.Cmd) error {
	for _, cmd := range cmds {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	for _, cmd := range cmds {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, fmt.Errorf("worker did not exit cleanly on SIGTERM: %w", err))
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			errs = append(errs, errors.New("worker did not stop within 10s of SIGTERM"))
		}
	}
	return errors.Join(errs...)
}

// waitSettled polls until every task is final or parked.
func waitSettled(ctx context.Context, e *env, n *service.Notifier, tasks []demoTask, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		open := 0
		for _, t := range tasks {
			dctx, cancel := e.dbContext(ctx)
			task, err := n.Task(dctx, t.TaskID)
			cancel()
			if err != nil {
				return err
			}
			if task.State == delivery.StatePending || task.State == delivery.StateSending ||
				(task.State == delivery.StateUnknown && !task.NeedsReview) {
				open++
			}
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d tasks still open after %s", open, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

type demoRow struct {
	demoTask
	task     service.Task
	attempts []service.AttemptRecord
	sends    int
	outbound int
}

type demoReportRows []demoRow

func demoReport(ctx context.Context, e *env, n *service.Notifier, tasks []demoTask, channels map[string]*fakes.Channel) (demoReportRows, error) {
	rows := make(demoReportRows, 0, len(tasks))
	for _, t := range tasks {
		dctx, cancel := e.dbContext(ctx)
		task, err := n.Task(dctx, t.TaskID)
		if err == nil {
			var attempts []service.AttemptRecord
			attempts, err = n.Attempts(dctx, t.TaskID)
			ch := channels[t.Channel]
			rows = append(rows, demoRow{demoTask: t, task: task, attempts: attempts,
				sends: ch.Sends(t.Ref), outbound: ch.Outbound(t.Ref)})
		}
		cancel()
		if err != nil {
			return nil, err
		}
	}
	return rows, nil
}

func (rows demoReportRows) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tUSER\tCHANNEL\tSTATE\tATTEMPTS (action:outcome)\tSENDS\tOUTBOUND")
	parked := []int64{}
	for _, r := range rows {
		steps := make([]string, len(r.attempts))
		for i, a := range r.attempts {
			steps[i] = string(a.Action) + ":" + string(a.Outcome)
		}
		state := string(r.task.State)
		if r.task.NeedsReview {
			state += " (parked)"
			parked = append(parked, r.TaskID)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\n", r.TaskID, r.user, r.Channel, state, strings.Join(steps, " -> "), r.sends, r.outbound)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, `
SENDS counts requests the fake received, OUTBOUND the messages it really sent. After a timeout the push
task was resent with the same Idempotency-Key (ACCEPTED_REPLAY: 2 sends, 1 message), the sms task was
looked up instead of resent (QUERY_FOUND), and the none task, whose channel can neither dedupe nor be
asked, was parked for a human rather than guessed at.`)
	for _, id := range parked {
		fmt.Fprintf(w, "Settle a parked task after checking with the channel:  notifier resolve --task %d --state SENT --note 'confirmed by the provider'\n", id)
	}
	return nil
}

// check asserts what the demo is meant to show.
func (rows demoReportRows) check(created int) error {
	var replay, found, parked bool
	for _, r := range rows {
		for _, a := range r.attempts {
			replay = replay || a.Outcome == delivery.OutcomeAcceptedReplay
			found = found || a.Outcome == delivery.OutcomeQueryFound
		}
		parked = parked || r.task.NeedsReview
		if r.Channel != "none" && r.outbound > 1 {
			return fmt.Errorf("demo: task %d went out %d times", r.TaskID, r.outbound)
		}
	}
	switch {
	case created != 12:
		return fmt.Errorf("demo: %d notifications created for 12 events", created)
	case !replay:
		return errors.New("demo: no ACCEPTED_REPLAY in the report")
	case !found:
		return errors.New("demo: no QUERY_FOUND in the report")
	case !parked:
		return errors.New("demo: no parked task in the report")
	}
	return nil
}
