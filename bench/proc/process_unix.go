//go:build unix

package proc

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user + system) this process has used so far (0 if it cannot be read).
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
