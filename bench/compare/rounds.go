package compare

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Round is one round of interleaved runs: one of ours and one of River's, run one after the other on
// the same database.
type Round struct {
	No    int     `json:"round"`
	Ours  Run     `json:"ours"`
	River Run     `json:"river"`
	Ratio float64 `json:"ratio"` // ours deliveries/s / River's
}

// RoundsResult is every round and the median of each figure, with the ratio's spread (lowest and
// highest): one run decides nothing on a machine whose throughput moves by half from run to run.
type RoundsResult struct {
	Rounds      []Round `json:"rounds"`
	MedianRatio float64 `json:"median_ratio"`
	MinRatio    float64 `json:"min_ratio"`
	MaxRatio    float64 `json:"max_ratio"`
	Ours        Medians `json:"ours"`
	River       Medians `json:"river"`
}

// Medians are one peer's medians over the rounds.
type Medians struct {
	DeliveriesPerSec       float64 `json:"deliveries_per_sec"`
	ServerCPUMSPerDelivery float64 `json:"server_cpu_ms_per_delivery"`
	CPUMSPerDelivery       float64 `json:"cpu_ms_per_delivery"`
	DBXactsPerDelivery     float64 `json:"db_xacts_per_delivery"`
	RowsWrittenPerDelivery float64 `json:"db_rows_written_per_delivery"`
	HOTUpdateShare         float64 `json:"hot_update_share"`
	AvgInFlight            float64 `json:"avg_in_flight,omitempty"`
	WindowBoundPerSec      float64 `json:"window_bound_per_sec,omitempty"`
}

// Rounds pairs runs given in order ours, River, ours, River... into rounds. It refuses an odd count,
// a pair not of one of ours then one of River's, and reports of different workloads.
func Rounds(runs []Run) (RoundsResult, error) {
	var res RoundsResult
	if len(runs) == 0 || len(runs)%2 != 0 {
		return res, &UsageError{Err: fmt.Errorf("--rounds: want pairs of reports, ours then River's, got %d", len(runs))}
	}
	if _, err := Compare(runs); err != nil { // one workload
		return res, err
	}
	var ratios []float64
	for i := 0; i < len(runs); i += 2 {
		o, r := runs[i], runs[i+1]
		if o.Peer == "river" || r.Peer != "river" {
			return res, &UsageError{Err: fmt.Errorf("--rounds: round %d is %s then %s; want ours then River's", i/2+1, o.Name, r.Name)}
		}
		ratio := 0.0
		if r.DeliveriesPerSec > 0 {
			ratio = round2(o.DeliveriesPerSec / r.DeliveriesPerSec)
		}
		res.Rounds = append(res.Rounds, Round{No: i/2 + 1, Ours: o, River: r, Ratio: ratio})
		ratios = append(ratios, ratio)
	}
	res.MedianRatio, res.MinRatio, res.MaxRatio = round2(median(ratios)), slices.Min(ratios), slices.Max(ratios)
	res.Ours = medians(res.Rounds, func(x Round) Run { return x.Ours })
	res.River = medians(res.Rounds, func(x Round) Run { return x.River })
	return res, nil
}

func medians(rounds []Round, of func(Round) Run) Medians {
	m := func(f func(Run) float64) float64 {
		var v []float64
		for _, x := range rounds {
			v = append(v, f(of(x)))
		}
		return median(v)
	}
	return Medians{
		DeliveriesPerSec:       m(func(r Run) float64 { return r.DeliveriesPerSec }),
		ServerCPUMSPerDelivery: m(func(r Run) float64 { return r.ServerCPUMSPerDelivery }),
		CPUMSPerDelivery:       m(func(r Run) float64 { return r.CPUMSPerDelivery }),
		DBXactsPerDelivery:     m(func(r Run) float64 { return r.DBXactsPerDelivery }),
		RowsWrittenPerDelivery: m(func(r Run) float64 { return r.RowsWrittenPerDelivery }),
		HOTUpdateShare:         m(func(r Run) float64 { return r.HOTUpdateShare }),
		AvgInFlight:            m(func(r Run) float64 { return r.AvgInFlight }),
		WindowBoundPerSec:      m(func(r Run) float64 { return r.WindowBoundPerSec }),
	}
}

// median of v (the mean of the middle two for an even count); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// Print writes a line per round and the medians.
func (res RoundsResult) Print(w io.Writer) error {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	first := res.Rounds[0]
	p("%d interleaved rounds: %s against %s; %d events, %s\n", len(res.Rounds), first.Ours.Setting(), first.River.Setting(),
		first.Ours.Notifications, describe(first.Ours.CallLatency))
	p("%-6s %11s %11s %6s  %21s  %17s  %17s  %11s\n", "round", "ours/s", "River/s", "ratio",
		"server CPU ms/del o/R", "xacts/del. o/R", "rows/del. o/R", "in flight o")
	line := func(label string, o, r Medians, ratio string) {
		p("%-6s %11.0f %11.0f %6s  %10.3f/%-10.3f  %8.3f/%-8.3f  %8.2f/%-8.2f  %5.0f/%-5d\n", label, o.DeliveriesPerSec, r.DeliveriesPerSec, ratio,
			o.ServerCPUMSPerDelivery, r.ServerCPUMSPerDelivery, o.DBXactsPerDelivery, r.DBXactsPerDelivery,
			o.RowsWrittenPerDelivery, r.RowsWrittenPerDelivery, o.AvgInFlight, first.Ours.Window)
	}
	for _, x := range res.Rounds {
		line(fmt.Sprint(x.No), medians([]Round{x}, func(x Round) Run { return x.Ours }),
			medians([]Round{x}, func(x Round) Run { return x.River }), fmt.Sprintf("%.2f", x.Ratio))
	}
	line("median", res.Ours, res.River, fmt.Sprintf("%.2f", res.MedianRatio))
	p("HOT updates (no index entry written), median share: ours %.0f%%, River %.0f%%\n", 100*res.Ours.HOTUpdateShare, 100*res.River.HOTUpdateShare)
	p("ours / River: median %.2f, spread %.2f-%.2f over %d rounds\n", res.MedianRatio, res.MinRatio, res.MaxRatio, len(res.Rounds))
	var ours, river []string
	for _, x := range res.Rounds {
		ours, river = append(ours, fmt.Sprint(x.Ours.Autovacuums)), append(river, fmt.Sprint(x.River.Autovacuums))
	}
	p("autovacuum runs finished in each round's phase (their CPU is the server's): ours %s, River %s\n",
		strings.Join(ours, " "), strings.Join(river, " "))
	if o, r := res.Ours, res.River; o.WindowBoundPerSec > 0 && r.WindowBoundPerSec > 0 && r.DeliveriesPerSec > 0 {
		// What the providers' answers alone allow: with a long tail, the slowest of the last calls ends
		// a run whatever the worker does, so no ratio can pass ours' bound over River's pace.
		p("window bound (each slot refilled the moment its call answers, the same answers): ours %.0f/s of %d, River %.0f/s of %d\n",
			o.WindowBoundPerSec, first.Ours.Window, r.WindowBoundPerSec, first.River.Window)
		p("bound reached, median: ours %.0f%%, River %.0f%%; ours / River at most %.2f (ours' bound / River's median)\n",
			100*o.DeliveriesPerSec/o.WindowBoundPerSec, 100*r.DeliveriesPerSec/r.WindowBoundPerSec, o.WindowBoundPerSec/r.DeliveriesPerSec)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
