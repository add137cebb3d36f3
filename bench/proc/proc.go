// Package proc reads what the bench reports about the machine from the operating system: the CPU this
// process and a PostgreSQL server on the same machine have used, the load average and this process's
// peak resident memory. Each reading is best effort: where it cannot be read it is zero or nil, and
// the report says so.
package proc

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/internal/cputime"
)

// LoadAvg is /proc/loadavg (1, 5, 15 minutes); nil where there is none.
func LoadAvg() []float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	fields := strings.Fields(string(data))
	if len(fields) < 3 {
		return nil
	}
	out := make([]float64, 0, 3)
	for _, f := range fields[:3] {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// PeakRSSMiB is VmHWM from /proc/self/status in MiB (0 where there is none).
func PeakRSSMiB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			if f := strings.Fields(rest); len(f) >= 1 {
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					return kb / 1024
				}
			}
		}
	}
	return 0
}

// ProcessCPU is the CPU time (user + system) this process has used so far (0 if it cannot be read):
// the Go benchmarks' own measure (internal/cputime), so that both speak of the same thing.
func ProcessCPU() time.Duration { return cputime.Process() }
