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
		Description: `Prints one notification, named by the (user, event key) it was created under or by its id
(create's notification_id), with every task and each task's attempts verbatim, in the shape notifier
review prints them. What a script that created an event reads to follow it: a task PENDING with no
attempt is waiting for a worker, or for the send_at it was created with (null: sent at once); SENT is accepted by the channel; UNKNOWN with needs_review is parked
for a human (notifier review, notifier resolve); FAILED and SUPPRESSED were certainly not sent.
Everything comes from one snapshot: a task's attempt_count and its attempts agree.

Prints one JSON object on stdout (here on several lines; it is one line):
  {"notification_id":3,"user_id":"u1","event_key":"order-1","created_at":"...","send_at":null,
   "expires_at":"...","tasks":[{"task_id":7,"channel":"push","ref":"...","state":"SENT","needs_review":false,
             "attempt_count":1,"last_error":null,
             "attempts":[{"attempt":1,"action":"SEND","worker":"w1","started_at":"...",
                          "finished_at":"...","outcome":"ACCEPTED","provider_msg_id":"..."}]}]}
tasks is [] when no channel was enabled for the user at creation; attempts is [] before the first
claim. The body is not printed.

Give exactly one of --notification, or --user with --event-key (else exit 2). No such notification:
nothing on stdout, a line on stderr, exit 3.

Role: notifier_operator. show reads the attempts, which notifier_creator may not read (schema/002);
a creator's script follows its events with an operator's login, or is told which role is missing.

` + exitCodesHelp,
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
