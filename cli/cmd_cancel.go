package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

func cancelCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "take an event back: its tasks not yet sent are never sent",
		UsageText: "notifier cancel --user U --event-key K [--note TEXT]",
		Description: `Cancels the notification of (user, event key), e.g. "order shipped" for an order cancelled
a minute later. Needs the notifier_creator role. What happens to each of its tasks:
  CANCELLED       waiting (due or not), and no attempt may have been accepted: now SUPPRESSED,
                  with a SKIP attempt CANCELLED. Never sent.
  PARKED          waiting, but an earlier call's outcome is unknown (the user may have it): parked
                  for review with a SKIP attempt CANCELLED_UNCERTAIN, never written off and never
                  called again. Settle it with notifier resolve.
  AT_NEXT_CLAIM   being called right now: a call on its way cannot be recalled. Its worker finishes
                  as usual (SENT if the channel accepted it); if that leaves the task waiting for a
                  retry, its next claim settles it as cancelled (or parked, if uncertain), with no
                  call.
  ALREADY_PARKED  parked before: unchanged.
  FINAL           SENT, FAILED or SUPPRESSED before: unchanged.
The notification stays: a later create of the same event answers created=false. --note is kept on
the notification and on each cancel attempt. A second cancel keeps the first one's time and note.

Prints one JSON object on stdout:
  {"user_id":"u1","event_key":"order-1001-shipped","notification_id":1,"changed":true,
   "tasks":[{"task_id":1,"channel":"push","state_before":"PENDING","state_after":"SUPPRESSED",
             "effect":"CANCELLED","changed":true}]}
Exit code 0 when something changed; 3 when nothing did (no such event, an event without tasks, or
every task already final or parked), with the reason on stderr.

` + exitCodesHelp,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "user", Usage: "user id (required)"},
			&cli.StringFlag{Name: "event-key", Usage: "the event's key, as given to create (required)"},
			&cli.StringFlag{Name: "note", Usage: fmt.Sprintf("why, kept with the cancel (at most %d characters)", service.MaxNoteLength)},
		},
		Action: func(c *cli.Context) error {
			if err := required(c, "user", "event-key"); err != nil {
				return err
			}
			if c.IsSet("note") && c.String("note") == "" {
				return usagef("cancel: --note is empty: give a reason or leave the flag out")
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			user, key := c.String("user"), c.String("event-key")
			out, err := service.NewNotifier(pool).Cancel(ctx, user, key, c.String("note"))
			if err != nil {
				return err
			}
			if err := e.printJSON(out); err != nil {
				return err
			}
			switch {
			case out.NotificationID == nil:
				return &unchangedError{msg: fmt.Sprintf("cancel %s/%s: nothing changed: no such event (or it has no tasks)", user, key)}
			case !out.Changed:
				return &unchangedError{msg: fmt.Sprintf("cancel %s/%s: nothing changed: every task is already final or parked, or was cancelled before", user, key)}
			}
			e.log.Info("cancelled", "notification", *out.NotificationID, "tasks", len(out.Tasks))
			return nil
		},
	}
}
