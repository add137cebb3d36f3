// Package proc reads what the bench reports about the machine from the operating system: the CPU a
// PostgreSQL server on the same machine has used (this process's own is internal/cputime's), the load
// average and this process's peak resident memory. Each reading is best effort: where it cannot be
// read it is zero or nil, and the report says so.
package proc

import (
	"os"
	"strconv"
	"strings"
	"time"
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

// Find finds the PostgreSQL server's processes on this machine from the pid of one of its backends
// (and the error of reading it), or says why not: nil and "not measured: ..." then.
func Find(backendPID int, err error) (*Server, string) {
	if err != nil {
		return nil, "not measured: " + err.Error()
	}
	s, err := NewServer(backendPID)
	if err != nil {
		return nil, "not measured: " + err.Error()
	}
	return s, ""
}

// Phase measures the server's CPU over one phase of a run: from Start to End.
type Phase struct {
	s    *Server
	mark Mark
	err  error
}

// Start starts measuring the server's CPU (s nil: not measured).
func (s *Server) Start() Phase {
	if s == nil {
		return Phase{}
	}
	m, err := s.Mark()
	return Phase{s: s, mark: m, err: err}
}

// End is the server's CPU time since Start: 0 when not measured or not readable.
func (p Phase) End() time.Duration {
	if p.s == nil || p.err != nil {
		return 0
	}
	d, err := p.s.Since(p.mark)
	if err != nil {
		return 0
	}
	return d
}
