// Package compare sets the JSON reports of load runs beside each other, ours (bench/load, peer
// "notifier") and the River peer's (bench/river, peer "river"): deliveries/s of each and the ratio of
// every one of ours to every River run. It refuses reports of different workloads (events,
// duplicates, latency model): a ratio between them is not a result.
package compare

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/notifierhq/notifier/bench/latency"
)

// UsageError is a command line compare refuses (exit 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return "compare: " + e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Run is the part of a report compare reads; both peers print these fields.
type Run struct {
	Name             string         `json:"name"`
	Peer             string         `json:"peer"`
	Notifications    int            `json:"notifications"`
	Duplicates       float64        `json:"duplicates"`
	Deliveries       int            `json:"deliveries"`
	DeliveriesPerSec float64        `json:"deliveries_per_sec"`
	CallLatency      latency.Report `json:"call_latency"`
	Check            string         `json:"check"`
	Workers          int            `json:"workers"` // ours: worker loops; River: MaxWorkers
	// CPU of the deliver phase per delivery: the peer's process (the queue, the HTTP client and the
	// fakes) and the PostgreSQL server's (0 when not measured).
	CPUMSPerDelivery       float64 `json:"cpu_ms_per_delivery"`
	ServerCPUMSPerDelivery float64 `json:"server_cpu_ms_per_delivery"`
	// What each delivery cost the database over the deliver phase (both peers).
	DBXactsPerDelivery     float64 `json:"db_xacts_per_delivery"`
	RowsWrittenPerDelivery float64 `json:"db_rows_written_per_delivery"`
	HOTUpdateShare         float64 `json:"hot_update_share"` // of the updates, those that wrote no index entry
	// Autovacuum and autoanalyze runs that finished in the deliver phase: server work its server CPU
	// counts, in some rounds and not others.
	Autovacuums int64 `json:"autovacuums"`
	// Deliveries/s of Window calls in flight, each slot refilled the moment its call answers, against
	// the same answers (latency.WindowBound; 0: the model has no such bound).
	WindowBoundPerSec float64 `json:"window_bound_per_sec,omitempty"`
	// Ours.
	AvgInFlight float64 `json:"avg_in_flight,omitempty"` // calls in flight on average, of Window
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	Finishers   int     `json:"finishers,omitempty"`
	Window      int     `json:"window"` // calls in flight at most (River: MaxWorkers)
	// River.
	FetchCooldownMS float64 `json:"fetch_cooldown_ms,omitempty"`
}

// Setting says how the run was configured.
func (r Run) Setting() string {
	if r.Peer == "river" {
		return fmt.Sprintf("River MaxWorkers %d, FetchCooldown %gms", r.Workers, r.FetchCooldownMS)
	}
	return fmt.Sprintf("%d loop(s) x --max-in-flight %d --batch %d --finishers %d", r.Workers, r.MaxInFlight, r.Batch, r.Finishers)
}

// Result is the comparison: every run, and ours / River for every pair.
type Result struct {
	Runs   []Run              `json:"runs"`
	Ratios map[string]float64 `json:"ratios"` // "OURS/RIVER" -> ours deliveries/s / River's
}

// Read decodes the report in file as the run called name (the file's name when empty).
func Read(name, file string) (Run, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Run{}, err
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return Run{}, fmt.Errorf("%s: not a bench report: %w", file, err)
	}
	if r.Peer != "notifier" && r.Peer != "river" {
		return Run{}, fmt.Errorf("%s: not a bench report (peer %q)", file, r.Peer)
	}
	if r.Peer == "river" {
		r.Window = r.Workers
	}
	r.Name = name
	if r.Name == "" {
		r.Name = file
	}
	return r, nil
}

// Compare checks the runs measured one workload and computes the ratios.
func Compare(runs []Run) (Result, error) {
	if len(runs) == 0 {
		return Result{}, errors.New("no reports")
	}
	first := runs[0]
	for _, r := range runs[1:] {
		if r.Notifications != first.Notifications || r.Duplicates != first.Duplicates {
			return Result{}, fmt.Errorf("%s ran %d events with %g duplicates, %s %d with %g: not one workload",
				r.Name, r.Notifications, r.Duplicates, first.Name, first.Notifications, first.Duplicates)
		}
		if r.CallLatency != first.CallLatency {
			return Result{}, fmt.Errorf("%s met calls %s (errors %g, seed %d), %s %s (errors %g, seed %d): not one workload",
				r.Name, r.CallLatency.Spec, r.CallLatency.Errors, r.CallLatency.Seed,
				first.Name, first.CallLatency.Spec, first.CallLatency.Errors, first.CallLatency.Seed)
		}
	}
	res := Result{Runs: runs, Ratios: map[string]float64{}}
	for _, o := range runs {
		for _, r := range runs {
			if o.Peer == "notifier" && r.Peer == "river" && r.DeliveriesPerSec > 0 {
				res.Ratios[o.Name+"/"+r.Name] = round2(o.DeliveriesPerSec / r.DeliveriesPerSec)
			}
		}
	}
	return res, nil
}

// Print writes the comparison as a table.
func (res Result) Print(w io.Writer) error {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	first := res.Runs[0]
	p("ours against River: %d events x 2 channels, %g%% repeated submissions; calls %s\n\n",
		first.Notifications, 100*first.Duplicates, describe(first.CallLatency))
	width := len("ours / River")
	for _, r := range res.Runs {
		width = max(width, len(r.Name))
	}
	p("%-*s %14s %8s %8s %13s  %-8s %s\n", width, "run", "deliveries/s", "window", "bound/s", "CPU ms/del.", "check", "setting")
	for _, r := range res.Runs {
		p("%-*s %14.0f %8d %8s %13s  %-8s %s\n", width, r.Name, r.DeliveriesPerSec, r.Window, bound(r), cpu(r), r.Check, r.Setting())
	}
	var ours, river []Run
	for _, r := range res.Runs {
		if r.Peer == "river" {
			river = append(river, r)
		} else {
			ours = append(ours, r)
		}
	}
	p("(bound/s: the window refilled the moment each call answers, against the same answers; CPU ms/del.: the\n")
	p(" peer's process, queue, HTTP client and fakes, + the PostgreSQL server's, per delivery)\n")
	if len(ours) > 0 && len(river) > 0 {
		p("\n%-*s", width, "ours / River")
		for _, r := range river {
			p("  %*s", max(10, len(r.Name)), r.Name)
		}
		p("\n")
		for _, o := range ours {
			p("%-*s", width, o.Name)
			for _, r := range river {
				p("  %*.2f", max(10, len(r.Name)), res.Ratios[o.Name+"/"+r.Name])
			}
			p("\n")
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// bound is the run's window bound per second, "-" when its model has none.
func bound(r Run) string {
	if r.WindowBoundPerSec <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r.WindowBoundPerSec)
}

// cpu is "PROCESS+SERVER" ms per delivery, "-" for what was not measured.
func cpu(r Run) string {
	f := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	}
	return f(r.CPUMSPerDelivery) + "+" + f(r.ServerCPUMSPerDelivery)
}

func describe(m latency.Report) string {
	s := "answered at once"
	if m.MedianMS > 0 {
		s = fmt.Sprintf("%s (lognormal, median %g ms, p99 %.0f ms)", m.Spec, m.MedianMS, m.P99MS)
	}
	if m.Errors > 0 {
		s += fmt.Sprintf(", %g%% refused with 503", 100*m.Errors)
	}
	return s + fmt.Sprintf(", seed %d", m.Seed)
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// Main is `bench compare [--json] NAME=FILE ...`: the table (or one JSON object), and an error when a
// report's final check failed or the reports are not of one workload. `bench compare --window FILE`
// prints the window (calls in flight at most) of one report, for a River run of equal concurrency.
func Main(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line (the caller's), not the whole help
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	window := fs.Bool("window", false, "print the window (calls in flight at most) of the one report given")
	rounds := fs.Bool("rounds", false, "the reports are interleaved rounds, ours then River's in each: print every round and the medians")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: bench compare [--json] [--rounds] NAME=FILE ...   (JSON reports of bench and bench/river)")
			fmt.Fprintln(stderr, "       bench compare --window FILE")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return err
		}
		return &UsageError{Err: err}
	}
	if fs.NArg() == 0 || (*window && fs.NArg() != 1) {
		return &UsageError{Err: errors.New("want NAME=FILE arguments (--window: one FILE)")}
	}
	var runs []Run
	for _, arg := range fs.Args() {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			name, file = "", arg
		}
		r, err := Read(name, file)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	if *window {
		_, err := fmt.Fprintln(stdout, runs[0].Window)
		return err
	}
	var res interface{ Print(io.Writer) error }
	var err error
	if *rounds {
		res, err = Rounds(runs)
	} else {
		res, err = Compare(runs)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		err = json.NewEncoder(stdout).Encode(res)
	} else {
		err = res.Print(stdout)
	}
	if err != nil {
		return err
	}
	var failed []string
	for _, r := range runs {
		if r.Check != "ok" {
			failed = append(failed, fmt.Sprintf("%s: %s", r.Name, r.Check))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("final check failed: %s", strings.Join(failed, "; "))
	}
	return nil
}
