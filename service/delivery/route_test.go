package delivery

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// ParseRate reads each unit, and refuses each malformed rate with its own reason, at each bound.
func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		rate float64
		why  string // the refusal's reason holds it; "": accepted
	}{
		{"50/s", 50, ""},
		{" 50 / s ", 50, ""}, // spaces around the parts
		{"3000/min", 50, ""},
		{"7200/h", 2, ""},
		{"0.5/s", 0.5, ""},
		{"1000000/s", MaxRate, ""},    // the largest
		{"60000000/min", MaxRate, ""}, // the largest, per minute
		{"1000001/s", 0, "more than 1000000/s"},
		{"60000001/min", 0, "more than 1000000/s"},
		{"5e-324/h", 0, "more than"}, // positive, but a rate of 0 once divided: refused, never 0
		{"50", 0, "no unit"},
		{"", 0, "not a number"},
		{"fast", 0, "not a number"},
		{"x/s", 0, "not a number"},
		{"NaN/s", 0, "not a number"},
		{"Inf/s", 0, "not a number"},
		{"-Inf/s", 0, "not a number"},
		{"0/s", 0, "not positive"},
		{"-1/s", 0, "not positive"},
		{"5/day", 0, "unknown unit"},
		{"5/", 0, "unknown unit"},
		{"5/S", 0, "unknown unit"}, // units are lowercase
	} {
		rate, err := ParseRate(c.in)
		if c.why == "" {
			if err != nil || rate != c.rate {
				t.Errorf("ParseRate(%q) = %v, %v; want %v", c.in, rate, err, c.rate)
			}
			continue
		}
		var ie *InputError
		if !errors.As(err, &ie) || ie.Field != "rate" || !strings.Contains(ie.Reason, c.why) || rate != 0 {
			t.Errorf("ParseRate(%q) = %v, %v; want an invalid rate: %s", c.in, rate, err, c.why)
		}
		if err != nil && !strings.Contains(err.Error(), "want a positive number of calls per s, min or h") {
			t.Errorf("ParseRate(%q): %v does not say what it wants", c.in, err)
		}
	}
}

func TestDefaultBurst(t *testing.T) {
	is := is.New(t)
	is.Equal(DefaultBurst(50), 50.0)                    // one second's worth
	is.Equal(DefaultBurst(0.01), 1.0)                   // at least one call
	is.Equal(DefaultBurst(1), 1.0)                      // at the edge
	is.Equal(DefaultBurst(2*MaxRate), float64(MaxRate)) // at most the table's bound
}

// Check refuses what the table's CHECKs would, naming the field, and passes each bound itself.
func TestRateLimitCheck(t *testing.T) {
	for _, c := range []struct {
		limit RateLimit
		field string // "": accepted
	}{
		{RateLimit{PerSecond: 50, Burst: 50}, ""},
		{RateLimit{PerSecond: 1e-9, Burst: 1}, ""},
		{RateLimit{PerSecond: MaxRate, Burst: MaxRate}, ""},
		{RateLimit{PerSecond: 0, Burst: 1}, "rate"},
		{RateLimit{PerSecond: -1, Burst: 1}, "rate"},
		{RateLimit{PerSecond: MaxRate + 1, Burst: 1}, "rate"},
		{RateLimit{PerSecond: math.NaN(), Burst: 1}, "rate"},
		{RateLimit{PerSecond: 1, Burst: 0.99}, "burst"},
		{RateLimit{PerSecond: 1, Burst: 0}, "burst"},
		{RateLimit{PerSecond: 1, Burst: MaxRate + 1}, "burst"},
		{RateLimit{PerSecond: 1, Burst: math.NaN()}, "burst"},
		{RateLimit{}, "rate"}, // the zero value is no limit to write
	} {
		err := c.limit.Check()
		var ie *InputError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%+v: %v; want it accepted", c.limit, err)
		case c.field != "" && (!errors.As(err, &ie) || ie.Field != c.field):
			t.Errorf("%+v: %v; want an invalid %s", c.limit, err, c.field)
		}
	}
}
