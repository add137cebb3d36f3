package proc

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/cputime"
)

func TestReadings(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc readings: Linux only")
	}
	is := is.New(t)
	before := cputime.Process()
	procBefore, err := ProcessCPU(os.Getpid())
	is.NoErr(err)                                                       // this process's stat read
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; { // burn a little CPU
	}
	is.True(cputime.Process() > before) // this process's CPU grows as it works
	procAfter, err := ProcessCPU(os.Getpid())
	is.NoErr(err)
	is.True(procAfter > procBefore) // and /proc says so too (ProcessCPU, a backend's CPU for costprobe)
	is.Equal(len(LoadAvg()), 3)     // 1, 5 and 15 minutes
	is.True(PeakRSSMiB() > 1)       // VmHWM read
	_, err = NewServer(os.Getpid()) // this process's parent is no postmaster
	is.True(err != nil)             // so no server is measured through it
}
