// Package cputime measures this process's CPU for benchmarks: the client's cost, which competes with
// PostgreSQL (its own processes, not counted) for the cores when both run on one machine.
package cputime

import (
	"testing"
	"time"
)

// ReportPerOp reports the process's CPU per iteration since start (a Process reading) as cpu-us/op.
func ReportPerOp(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((Process()-start).Microseconds())/float64(b.N), "cpu-us/op")
}
