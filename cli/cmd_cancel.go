package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

func cancelCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:        "cancel",
		Usage:       "take an event back: its tasks not yet sent are never sent",
		UsageText:   "notifier cancel --user U --event-key K [--note TEXT]",
		Description: helpText("cancel"),
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
