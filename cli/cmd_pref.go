package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

func prefCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "pref",
		Usage: "manage a user's channel preferences",
		Description: `Subcommands: set (prints the stored preference as one JSON object on stdout).

` + exitCodesHelp,
		Subcommands: []*cli.Command{{
			Name:      "set",
			Usage:     "create or replace a user's address and switch on one channel",
			UsageText: "notifier pref set --user U --channel C --address A [--enabled=true|false]",
			Description: `Creates or replaces the user's address and on/off switch for one channel. Disabling takes
effect for every task not yet claimed: it is then SUPPRESSED instead of sent.

Prints one JSON object on stdout, the stored preference:
  {"user_id":"u1","channel":"push","address":"...","enabled":true,"version":1,"updated_at":"..."}

` + exitCodesHelp,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "user", Usage: "user id (required)"},
				&cli.StringFlag{Name: "channel", Usage: "channel name, e.g. push, sms (required)"},
				&cli.StringFlag{Name: "address", Usage: "the user's address on the channel (required)"},
				&cli.BoolFlag{Name: "enabled", Value: true, Usage: "deliver on this channel (--enabled=false to switch off)"},
			},
			Action: func(c *cli.Context) error {
				if err := required(c, "user", "channel", "address"); err != nil {
					return err
				}
				pool, err := e.pool(0)
				if err != nil {
					return err
				}
				defer pool.Close()
				ctx, cancel := e.dbContext(c.Context)
				defer cancel()
				pref, err := service.NewNotifier(pool).SetPreference(ctx,
					c.String("user"), c.String("channel"), c.String("address"), c.Bool("enabled"))
				if err != nil {
					return err
				}
				return e.printJSON(pref)
			},
		}},
	}
}

// createOutput is what create prints, and each result line of create --jsonl.
