//go:build unix

package service_test

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time this process has used, user and system. The database under test runs in
// its own processes, so it is not counted.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
