package cli

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

func showCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "show",
		Usage: "print one notification as it stands: its tasks, their states and every attempt",
		UsageText: "notifier show --user U --event-key K\n" +
			"   notifier show --notification N",
		Description: helpText("show"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "user", Usage: "user id the event was created for (with --event-key)"},
			&cli.StringFlag{Name: "event-key", Usage: "the event's key (with --user)"},
			&cli.Int64Flag{Name: "notification", Usage: "notification id, as create printed it"},
		},
		Action: func(c *cli.Context) error {
			req, err := showRequest(c)
			if err != nil {
				return err
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			report, err := service.NewNotifier(pool).Show(ctx, req)
			if errors.Is(err, delivery.ErrNotFound) {
				return &unchangedError{msg: "show: no such notification: " + describeShown(req)}
			}
			if err != nil {
				return err
			}
			return e.printJSON(report)
		},
	}
}

// showRequest reads show's selector: --notification, or --user with --event-key; exactly one.
func showRequest(c *cli.Context) (service.ShowRequest, error) {
	byID, byUser, byKey := c.IsSet("notification"), c.IsSet("user"), c.IsSet("event-key")
	switch {
	case byID && (byUser || byKey):
		return service.ShowRequest{}, usagef("show: give --notification, or --user with --event-key, not both")
	case byID:
		id := c.Int64("notification")
		if id <= 0 {
			return service.ShowRequest{}, usagef("show: invalid --notification %d: must be a notification id (more than 0)", id)
		}
		return service.ShowRequest{NotificationID: id}, nil
	case byUser && byKey:
		req := service.ShowRequest{UserID: c.String("user"), EventKey: c.String("event-key")}
		return req, req.Validate()
	case byUser:
		return service.ShowRequest{}, usagef("show: --user needs --event-key (or give --notification instead)")
	case byKey:
		return service.ShowRequest{}, usagef("show: --event-key needs --user (or give --notification instead)")
	}
	return service.ShowRequest{}, usagef("show: name the notification: --notification N, or --user U --event-key K")
}

// describeShown names the notification req asks for, as a user typed it.
func describeShown(req service.ShowRequest) string {
	if req.NotificationID > 0 {
		return fmt.Sprintf("--notification %d", req.NotificationID)
	}
	return fmt.Sprintf("--user %q --event-key %q", req.UserID, req.EventKey)
}
