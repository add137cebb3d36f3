package delivery

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Route is one channel a dispatcher serves: its name (as in channel_pref.channel), its contract, the
// client that calls it, and the rate limit this worker sets on it (written into its bucket when the dispatcher is built).
type Route struct {
	Mode      Mode
	Contract  Contract
	Client    Channel
	RateLimit RateLimit
}

// RateLimit is what a worker's channels file sets on a channel: PerSecond calls a second, at most Burst
// at once. The zero value sets nothing (the worker still honours a bucket another worker set).
type RateLimit struct {
	PerSecond float64
	Burst     float64
}

// Bounds of a rate limit (the table's CHECKs).
const (
	MaxRate = 1_000_000 // calls a second, and calls in a burst
)

// ParseRate reads a rate as calls per second: "50/s", "3000/min" or "20000/h", a positive number of
// calls per unit.
func ParseRate(s string) (float64, error) {
	bad := func(why string) error {
		return &InputError{Field: "rate", Reason: fmt.Sprintf("%q: %s: want a positive number of calls per s, min or h, such as \"50/s\" or \"3000/min\"", s, why)}
	}
	count, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if _, err := strconv.ParseFloat(count, 64); !ok && err == nil {
		return 0, bad("no unit")
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(count), 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, bad("not a number")
	}
	if n <= 0 {
		return 0, bad("not positive")
	}
	per := map[string]float64{"s": 1, "min": 60, "h": 3600}[strings.TrimSpace(unit)]
	if per == 0 {
		return 0, bad("unknown unit")
	}
	if rate := n / per; rate <= MaxRate && rate > 0 {
		return rate, nil
	}
	return 0, bad(fmt.Sprintf("more than %d/s", MaxRate))
}

// DefaultBurst is the burst of a limit that sets none: one second's worth, at least one call.
func DefaultBurst(perSecond float64) float64 { return min(MaxRate, max(1, perSecond)) }

// Check refuses a limit the table would refuse.
func (r RateLimit) Check() error {
	switch {
	case !(r.PerSecond > 0 && r.PerSecond <= MaxRate):
		return &InputError{Field: "rate", Reason: fmt.Sprintf("%v/s: want more than 0 and at most %d/s", r.PerSecond, MaxRate)}
	case !(r.Burst >= 1 && r.Burst <= MaxRate):
		return &InputError{Field: "burst", Reason: fmt.Sprintf("%v: want 1 to %d", r.Burst, MaxRate)}
	}
	return nil
}
