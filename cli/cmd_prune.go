package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

// pruneOutput is what prune prints: what it deleted (with --dry-run: what it would delete).
type pruneOutput struct {
	service.PruneStats
	DryRun bool `json:"dry_run,omitempty"`
}

func pruneCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:        "prune",
		Usage:       "delete finished history older than a retention period, in small batches",
		UsageText:   "notifier prune --older-than 720h [--batch 1000] [--pause 0s] [--dry-run]",
		Description: strings.ReplaceAll(helpText("prune"), "{{min_retention}}", service.MinRetention.String()),
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "older-than", Usage: fmt.Sprintf("retention period, at least %s, e.g. 720h (required)", service.MinRetention)},
			&cli.IntFlag{Name: "batch", Value: 1000, Usage: fmt.Sprintf("rows per table per transaction (1-%d)", service.MaxPruneBatch)},
			&cli.DurationFlag{Name: "pause", Usage: fmt.Sprintf("wait between batches (0 to %s)", service.MaxPrunePause)},
			&cli.BoolFlag{Name: "dry-run", Usage: "count what would be deleted; delete nothing"},
		},
		Action: func(c *cli.Context) error {
			if err := required(c, "older-than"); err != nil {
				return err
			}
			olderThan, batch, pause := c.Duration("older-than"), c.Int("batch"), c.Duration("pause")
			if olderThan < service.MinRetention {
				return usagef("invalid --older-than %s: must be at least %s", olderThan, service.MinRetention)
			}
			if batch < 1 || batch > service.MaxPruneBatch {
				return usagef("invalid --batch %d: want 1 to %d", batch, service.MaxPruneBatch)
			}
			if pause < 0 || pause > service.MaxPrunePause {
				return usagef("invalid --pause %s: want 0 to %s", pause, service.MaxPrunePause)
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			n := service.NewNotifier(pool)
			if c.Bool("dry-run") {
				ctx, cancel := e.dbContext(c.Context)
				defer cancel()
				st, err := n.PrunePreview(ctx, olderThan, batch)
				if err != nil {
					return err
				}
				return e.printJSON(pruneOutput{PruneStats: st, DryRun: true})
			}
			started := time.Now()
			st, err := n.Prune(c.Context, olderThan, batch, pause)
			if err != nil {
				return err
			}
			e.log.Info("pruned", "older_than", olderThan, "tasks", st.Tasks, "attempts", st.Attempts,
				"notifications", st.Notifications, "batches", st.Batches, "took", time.Since(started).Round(time.Millisecond))
			return e.printJSON(pruneOutput{PruneStats: st})
		},
	}
}
