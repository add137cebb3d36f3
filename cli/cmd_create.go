package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

type createOutput = service.Created

func createCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "create",
		Usage: "submit an event: one logical notification per (user, event key)",
		UsageText: "notifier create --user U --event-key K --body B|- [--ttl 24h] [--max-attempts 3] [--channels push,sms | --fallback push,sms,email]\n" +
			"     [--send-at 2026-12-24T09:00:00Z | --delay 90m]\n" +
			"   notifier create --jsonl FILE|- [--batch-size 1000] [--ttl 24h] [--max-attempts 3]",
		Description: helpText("create"),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "user", Usage: "user id (required without --jsonl)"},
			&cli.StringFlag{Name: "event-key", Usage: "the event's key, unique per user, e.g. order-1001-shipped (required without --jsonl)"},
			&cli.StringFlag{Name: "body", Usage: "message body, or - to read it from stdin (required without --jsonl)"},
			&cli.DurationFlag{Name: "ttl", Value: 24 * time.Hour, Usage: "not delivered after this long"},
			&cli.IntFlag{Name: "max-attempts", Value: 3, Usage: "attempts per channel before giving up or parking"},
			&cli.StringFlag{Name: "jsonl", Usage: "submit the events of `FILE` (- for stdin), one JSON object per line"},
			&cli.StringFlag{Name: "channels", Usage: "only these of the user's enabled channels, comma-separated, e.g. push,sms (default: every enabled channel)"},
			&cli.StringFlag{Name: "send-at", Usage: "deliver at `TIME` (RFC 3339, e.g. 2026-12-24T09:00:00Z), not before"},
			&cli.DurationFlag{Name: "delay", Usage: "deliver this long after the database's now, not before"},
			&cli.StringFlag{Name: "fallback", Usage: "an ordered chain, comma-separated, e.g. push,sms,email: each next channel is called only when the one before ended certainly not sent"},
			&cli.IntFlag{Name: "batch-size", Value: 1000, Usage: fmt.Sprintf("with --jsonl: events per transaction (1-%d)", service.MaxCreateBatch)},
		},
		Action: func(c *cli.Context) error {
			if c.IsSet("jsonl") {
				return createMany(c, e)
			}
			if c.IsSet("batch-size") {
				return usagef("create: --batch-size applies to --jsonl only")
			}
			if err := required(c, "user", "event-key", "body"); err != nil {
				return err
			}
			body := c.String("body")
			if body == "-" {
				b, err := io.ReadAll(io.LimitReader(e.stdin, service.MaxBodyBytes+1))
				if err != nil {
					return fmt.Errorf("read body from stdin: %w", err)
				}
				if len(b) > service.MaxBodyBytes {
					return usagef("body on stdin is larger than the limit of %d bytes", service.MaxBodyBytes)
				}
				body = string(b)
			}
			req := service.CreateRequest{UserID: c.String("user"), EventKey: c.String("event-key"), Body: body,
				TTL: c.Duration("ttl"), MaxAttempts: c.Int("max-attempts")}
			if c.IsSet("channels") {
				channels, err := parseChannelsFlag(c.String("channels"))
				if err != nil {
					return err
				}
				req.Channels = channels
			}
			if c.IsSet("send-at") {
				t, err := parseSendAt(c.String("send-at"))
				if err != nil {
					return usagef("invalid --send-at: %v", err)
				}
				req.SendAt = t
			}
			if c.IsSet("delay") {
				req.Delay = c.Duration("delay")
				if req.Delay == 0 {
					return usagef("invalid --delay 0s: a delay is more than 0 (leave it out to send at once)")
				}
			}
			if c.IsSet("fallback") {
				chain, err := parseFallbackFlag(c.String("fallback"))
				if err != nil {
					return err
				}
				req.Fallback = chain
			}
			if err := req.Validate(); err != nil {
				return err
			}
			pool, err := e.pool(0)
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx, cancel := e.dbContext(c.Context)
			defer cancel()
			out, err := service.NewNotifier(pool).CreateBatch(ctx, []service.CreateRequest{req})
			if err != nil {
				return err
			}
			e.log.Debug("create", "notification", out[0].NotificationID, "created", out[0].Created, "tasks", len(out[0].Tasks))
			return e.printJSON(createOutput(out[0]))
		},
	}
}

// createMany is create --jsonl.
func createMany(c *cli.Context, e *env) error {
	for _, f := range []string{"user", "event-key", "body", "channels", "fallback", "send-at", "delay"} {
		if c.IsSet(f) {
			return usagef("create: --%s does not go with --jsonl (each line names its event and its send_at)", f)
		}
	}
	batch := c.Int("batch-size")
	if batch < 1 || batch > service.MaxCreateBatch {
		return usagef("invalid --batch-size %d: want 1 to %d", batch, service.MaxCreateBatch)
	}
	defaults := service.CreateRequest{TTL: c.Duration("ttl"), MaxAttempts: c.Int("max-attempts")}
	// The defaults must be valid on their own: a line that relies on them would be refused otherwise.
	if err := (service.CreateRequest{UserID: "u", EventKey: "k", Body: "b", TTL: defaults.TTL, MaxAttempts: defaults.MaxAttempts}).Validate(); err != nil {
		return err
	}
	var in io.Reader = e.stdin
	if name := c.String("jsonl"); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return usagef("create --jsonl: %v", err)
		}
		defer f.Close()
		in = f
	}
	pool, err := e.pool(0)
	if err != nil {
		return err
	}
	defer pool.Close()
	return createJSONL(c.Context, e, service.NewNotifier(pool), in, batch, defaults)
}

// parseSendAt reads a send time: RFC 3339 with a zone (create --send-at, a --jsonl line's send_at).
func parseSendAt(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time such as 2026-12-24T09:00:00Z", v)
	}
	return t, nil
}

// parseChannelsFlag reads create's --channels: comma-separated channel names, each named once. A name
// that is not a channel name is invalid input (exit 2), caught before anything is written.
func parseChannelsFlag(v string) ([]string, error) {
	var channels []string
	for _, c := range strings.Split(v, ",") {
		c = strings.TrimSpace(c)
		if !slices.Contains(channels, c) {
			channels = append(channels, c)
		}
	}
	if err := (service.CreateRequest{Channels: channels}).ValidateChannels(); err != nil {
		return nil, err
	}
	return channels, nil
}

// parseFallbackFlag reads create's --fallback: comma-separated channel names in chain order. Unlike
// --channels, a name given twice is refused (exit 2): its place in the chain would be ambiguous.
func parseFallbackFlag(v string) ([]string, error) {
	var chain []string
	for _, c := range strings.Split(v, ",") {
		chain = append(chain, strings.TrimSpace(c))
	}
	if err := (service.CreateRequest{Fallback: chain}).ValidateChannels(); err != nil {
		return nil, err
	}
	return chain, nil
}
