package workload

import (
	"context"
	"fmt"
	"io"
	"os/exec"
)

// PhaseHook is called by both sides just before their measured deliver phase starts ("start": its
// tasks or jobs created, nothing delivered yet, and no connection of the phase's open: each side
// opens them after the mark) and just after it ends ("end": every delivery done and the workers
// stopped), and waits for it: its time is not the phase's. nil: no hook. bench/cost-vs-river.sh counts
// the instructions of the server's backends born between the two.
type PhaseHook func(ctx context.Context, phase string) error

// PhaseHookUsage is the help of the --phase-hook flag of both sides.
const PhaseHookUsage = "a shell command run (sh -c) with the word start appended just before the measured deliver phase, and with end just after it (its workers stopped); the run waits for it, outside the phase's time, and fails if it fails (bench/cost-vs-river.sh marks the phase with it)"

// ShellHook is the PhaseHook of --phase-hook CMD: `sh -c "CMD PHASE"`, its output on out (the
// sides' stdout is their JSON report). "" is no hook.
func ShellHook(cmd string, out io.Writer) PhaseHook {
	if cmd == "" {
		return nil
	}
	return func(ctx context.Context, phase string) error {
		c := exec.CommandContext(ctx, "sh", "-c", cmd+" "+phase)
		c.Stdout, c.Stderr = out, out
		if err := c.Run(); err != nil {
			return fmt.Errorf("--phase-hook %s: %w", phase, err)
		}
		return nil
	}
}
