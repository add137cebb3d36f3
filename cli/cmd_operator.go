package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// resolveOutput is what resolve prints when it changed the task.
type resolveOutput struct {
	TaskID  int64          `json:"task_id"`
	State   delivery.State `json:"state"`
	Changed bool           `json:"changed"`
}

func resolveCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "resolve",
		Usage:     "settle a parked task by hand: SENT or FAILED",
		UsageText: "notifier resolve --task N --state SENT|FAILED --note TEXT [--operator NAME]",
		Description: `A human's final word on a parked task (state UNKNOWN, needs review; see notifier review), after
checking with the channel whether the message went out. Appends a MANUAL_SENT or MANUAL_FAILED
attempt with the note and the operator. Only a parked task changes; a second resolve of the same
task changes nothing.

Prints one JSON object on stdout when the task changed (exit 0):
  {"task_id":7,"state":"SENT","changed":true}
When nothing changed it prints nothing on stdout, says why on stderr (no such task, not parked,
already resolved) and exits 3.

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.Int64Flag{Name: "task", Usage: "task id (required)"},
			&cli.StringFlag{Name: "state", Usage: "SENT or FAILED (required)"},
			&cli.StringFlag{Name: "note", Usage: "why, e.g. what the channel's support said (required)"},
			&cli.StringFlag{Name: "operator", Usage: "who resolves (default: $USER, else \"operator\")"},
		},
		Action: func(c *cli.Context) error {
			if err := required(c, "task", "state", "note"); err != nil {
				return err
			}
			taskID := c.Int64("task")
			if taskID <= 0 {
				return usagef("invalid --task %d: must be a task id (more than 0)", taskID)
			}
			final := delivery.State(strings.ToUpper(strings.TrimSpace(c.String("state"))))
			if final != delivery.StateSent && final != delivery.StateFailed {
				return usagef("invalid --state %q: want SENT or FAILED", c.String("state"))
			}
			operator := c.String("operator")
			if !c.IsSet("operator") {
				if operator = e.getenv("USER"); operator == "" {
					operator = "operator"
				}
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			n := service.NewNotifier(pool)
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			changed, err := n.ResolveManually(ctx, taskID, final, c.String("note"), operator)
			if err != nil {
				return err
			}
			if !changed {
				return whyUnchanged(ctx, n, taskID)
			}
			e.log.Info("resolved", "task", taskID, "state", final, "operator", operator)
			return e.printJSON(resolveOutput{TaskID: taskID, State: final, Changed: true})
		},
	}
}

// whyUnchanged tells which case left a task unchanged by resolve.
func whyUnchanged(ctx context.Context, n *service.Notifier, taskID int64) error {
	task, err := n.Task(ctx, taskID)
	if errors.Is(err, delivery.ErrNotFound) {
		return &unchangedError{msg: fmt.Sprintf("task %d not changed: no such task", taskID)}
	}
	if err != nil {
		return &unchangedError{msg: fmt.Sprintf("task %d not changed (reading it failed: %v)", taskID, err)}
	}
	attempts, err := n.Attempts(ctx, taskID)
	if err == nil && len(attempts) > 0 {
		if last := attempts[len(attempts)-1]; last.Action == delivery.ActionManual {
			return &unchangedError{msg: fmt.Sprintf("task %d not changed: already resolved (state %s, %s by %s)",
				taskID, task.State, last.Outcome, last.Worker)}
		}
	}
	if task.State == delivery.StateUnknown && task.NeedsReview {
		return &unchangedError{msg: fmt.Sprintf("task %d not changed: it was resolved concurrently", taskID)}
	}
	return &unchangedError{msg: fmt.Sprintf("task %d not changed: not parked (state %s); only a task waiting for review can be resolved", taskID, task.State)}
}

func reviewCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "review",
		Usage:     "list tasks a human must look at (parked; final but contradicted by a late answer or a receipt), with their attempts",
		UsageText: "notifier review [--limit 50] [--after ID]",
		Description: `Lists, oldest first and with every attempt verbatim, the tasks a human must look at:
  review "PARKED"         state UNKNOWN, needs review: the channel may or may not have accepted the
                          message and the service will not guess. Settle each with notifier resolve.
  review "LATE_ACCEPTED"  state FAILED or SUPPRESSED (final), but a superseded holder's late answer
                          says the channel accepted the message after all (an attempt's late_outcome
                          is ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND), or a provider's receipt came
                          (notifier receipts): the user may have received it.
                          The state stays final; there is nothing to resolve, only to know.

Prints JSON lines on stdout, one object per task (nothing when there is none):
  {"task_id":7,"notification_id":3,"channel":"none","state":"UNKNOWN",...,"review":"PARKED",
   "user_id":"u1","event_key":"order-1","attempts":[{"attempt":1,"action":"SEND","outcome":"TIMEOUT",...}]}
Page with --after set to the last task_id printed.

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many tasks (1-1000)"},
			&cli.Int64Flag{Name: "after", Usage: "only tasks with an id greater than this"},
		},
		Action: func(c *cli.Context) error {
			limit, after := c.Int("limit"), c.Int64("after")
			if limit < 1 || limit > 1000 {
				return usagef("invalid --limit %d: want 1 to 1000", limit)
			}
			if after < 0 {
				return usagef("invalid --after %d: must not be negative", after)
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			parked, err := service.NewNotifier(pool).Review(ctx, after, limit)
			if err != nil {
				return err
			}
			for _, p := range parked {
				if err := e.printJSON(p); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func statusCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:        "status",
		Usage:       "count tasks by channel and state; parked tasks; age of the oldest due task; paused channels; rate limits",
		UsageText:   "notifier status [--json]",
		Description: helpText("status"),
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"},
		},
		Action: func(c *cli.Context) error {
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			st, err := service.NewNotifier(pool).Status(ctx)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if st.Counts == nil {
					st.Counts = []service.StateCount{}
				}
				if st.Receipts == nil {
					st.Receipts = []service.ReceiptCount{}
				}
				if st.RateLimits == nil {
					st.RateLimits = []service.Bucket{}
				}
				if st.ChannelPauses == nil {
					st.ChannelPauses = []service.ChannelPause{}
				}
				return e.printJSON(st)
			}
			return printStatus(e, st)
		},
	}
}

func printStatus(e *env, st service.Status) error {
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CHANNEL\tSTATE\tTASKS")
	for _, sc := range st.Counts {
		state := string(sc.State)
		if sc.Parked {
			state += " (parked)"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\n", sc.Channel, state, sc.Tasks)
	}
	if len(st.Counts) == 0 {
		fmt.Fprintln(w, "-\t-\t0")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "parked tasks:\t%d\n", st.Parked)
	fmt.Fprintf(w, "not sent, but a late answer or a receipt says accepted:\t%d\n", st.LateAccepted)
	oldest := "none due"
	if st.OldestReadySeconds > 0 {
		oldest = fmt.Sprintf("%.1fs", st.OldestReadySeconds)
	}
	fmt.Fprintf(w, "oldest due task waiting:\t%s\n", oldest)
	fmt.Fprintf(w, "scheduled, not due yet:\t%d\n", st.Scheduled)
	fmt.Fprintf(w, "database:\t%s\n", describeStanding(st.Database.ServerStanding))
	for _, warning := range st.Database.Warnings {
		fmt.Fprintf(w, "warning:\t%s\n", warning)
	}
	if len(st.Receipts) > 0 {
		var parts []string
		for _, r := range st.Receipts {
			parts = append(parts, fmt.Sprintf("%s %s %d", r.Kind, r.Effect, r.Receipts))
		}
		fmt.Fprintf(w, "receipts (kind, effect):\t%s\n", strings.Join(parts, ", "))
	}
	if len(st.ChannelPauses) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "CHANNEL\tPAUSED FOR ITS ACCOUNT SINCE\tBACKOFF\tNEXT PROBE\tCAUSE")
		for _, p := range st.ChannelPauses {
			next := "now"
			if p.NextProbe > 0 {
				next = fmt.Sprintf("in %.0fs", math.Ceil(p.NextProbe))
			}
			// %q: the cause is the provider's text, and a terminal must not take it for control sequences.
			fmt.Fprintf(w, "%s\t%s (%s ago)\t%gs\t%s\t%q\n", p.Channel, p.Since.UTC().Format("2006-01-02 15:04:05 UTC"),
				time.Duration(p.PausedFor*float64(time.Second)).Round(time.Second), p.Backoff, next, p.Cause)
		}
	}
	if len(st.RateLimits) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "CHANNEL\tRATE/S\tBURST\tTOKENS\tPAUSED")
		for _, b := range st.RateLimits {
			paused := "-"
			if b.PausedFor > 0 {
				paused = fmt.Sprintf("%.1fs more", b.PausedFor)
			}
			fmt.Fprintf(w, "%s\t%g\t%g\t%.1f\t%s\n", b.Channel, b.PerSecond, b.Burst, b.Tokens, paused)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}

// describeStanding says in a line what a commit on the server survives.
func describeStanding(s service.ServerStanding) string {
	if !s.Writable() {
		return "read-only (a standby, or a demoted primary): workers and create refuse it"
	}
	seen := ""
	if s.SyncStandbys != nil {
		seen = fmt.Sprintf(", %d synchronous now", *s.SyncStandbys)
	}
	switch s.Durability() {
	case service.DurabilitySynchronous:
		return fmt.Sprintf("commits wait for a standby (synchronous_standby_names=%q; %d standby(s)%s)", s.SynchronousStandbyNames, s.Standbys, seen)
	case service.DurabilityAsynchronous:
		return fmt.Sprintf("commits do NOT wait for a standby (%d standby(s), asynchronous)", s.Standbys)
	}
	return "no standby replicates from this server (commits are as durable as its disk)"
}
