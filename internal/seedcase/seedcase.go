// Package seedcase reads the expected end of each of the seed design's cases from
// testdata/seed/traces.json, so that every test playing a case (cycle by cycle, through the streaming
// worker, through worker processes) holds it to the same expectation.
package seedcase

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
)

// Trace is how a case must end. Counts that are nil are not checked.
type Trace struct {
	Outcomes     []string `json:"outcomes"`
	LateOutcomes []string `json:"late_outcomes"`
	State        string   `json:"state"`
	Parked       bool     `json:"parked"`
	Sends        *int     `json:"sends"`
	Queries      *int     `json:"queries"`
	Outbound     *int     `json:"outbound"`
}

// Got is what a test observed of a case's task.
type Got struct {
	Outcomes     []string
	LateOutcomes []string // per attempt, "" for none; compared only when the trace names them
	State        string
	Parked       bool
	Sends        int
	Queries      int
	Outbound     int
}

// Load reads the trace of the named case.
func Load(name string) (Trace, error) {
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "testdata", "seed", "traces.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return Trace{}, err
	}
	var f struct {
		Cases map[string]Trace `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return Trace{}, fmt.Errorf("%s: %w", path, err)
	}
	tr, ok := f.Cases[name]
	if !ok {
		return Trace{}, fmt.Errorf("%s: no case %q", path, name)
	}
	return tr, nil
}

// Diff lists how got departs from the trace; none when it ends as it must.
func (tr Trace) Diff(got Got) []string {
	var d []string
	if !slices.Equal(got.Outcomes, tr.Outcomes) {
		d = append(d, fmt.Sprintf("outcomes %v, want %v", got.Outcomes, tr.Outcomes))
	}
	if tr.LateOutcomes != nil && !slices.Equal(got.LateOutcomes, tr.LateOutcomes) {
		d = append(d, fmt.Sprintf("late outcomes %q, want %q", got.LateOutcomes, tr.LateOutcomes))
	}
	if got.State != tr.State {
		d = append(d, fmt.Sprintf("state %s, want %s", got.State, tr.State))
	}
	if got.Parked != tr.Parked {
		d = append(d, fmt.Sprintf("parked %v, want %v", got.Parked, tr.Parked))
	}
	for _, c := range []struct {
		what string
		want *int
		got  int
	}{{"requests", tr.Sends, got.Sends}, {"queries", tr.Queries, got.Queries}, {"new messages", tr.Outbound, got.Outbound}} {
		if c.want != nil && *c.want != c.got {
			d = append(d, fmt.Sprintf("%s %d, want %d", c.what, c.got, *c.want))
		}
	}
	return d
}

// T is what Check needs of a *testing.T.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Check fails t unless got ends the case name as testdata/seed/traces.json says.
func Check(t T, name string, got Got) {
	t.Helper()
	tr, err := Load(name)
	if err != nil {
		t.Fatalf("seed case %s: %v", name, err)
	}
	for _, d := range tr.Diff(got) {
		t.Errorf("seed case %s: %s", name, d)
	}
}
