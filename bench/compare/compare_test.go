package compare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

func write(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const model = `"call_latency":{"spec":"100ms,0.8","median_ms":100,"sigma":0.8,"p90_ms":279,"p99_ms":643,"errors":0,"seed":1}`

func TestCompare(t *testing.T) {
	is := is.New(t)
	ours := write(t, "ours.json", `{"peer":"notifier","notifications":2000,"duplicates":0.1,"deliveries":4000,"deliveries_per_sec":1800,"workers":1,"max_in_flight":256,"batch":64,"finishers":2,"window":256,"cpu_ms_per_delivery":0.16,"server_cpu_ms_per_delivery":0.153,`+model+`,"check":"ok","extra":1}`)
	river := write(t, "river.json", `{"peer":"river","notifications":2000,"duplicates":0.1,"deliveries":4000,"deliveries_per_sec":1200,"workers":1000,"fetch_cooldown_ms":1,`+model+`,"check":"ok"}`)
	var out bytes.Buffer
	is.NoErr(Main([]string{"ours=" + ours, "river-1000=" + river}, &out, &bytes.Buffer{})) // one workload, both ok
	table := out.String()
	is.True(strings.Contains(table, "100ms,0.8"))             // the model, named
	is.True(strings.Contains(table, "River MaxWorkers 1000")) // River's setting
	is.True(strings.Contains(table, "--max-in-flight 256"))   // ours
	is.True(strings.Contains(table, "1.50"))                  // 1800 / 1200
	is.True(strings.Contains(table, "0.160+0.153"))           // ours' CPU per delivery, process + server
	is.True(strings.Contains(table, "-+-"))                   // River's, not measured in this report
	is.True(strings.Contains(table, "     -   0.160+0.153"))  // no window bound in ours' report
	is.True(strings.Contains(table, "10% repeated"))          // the duplicates' share, in percent
	is.True(!strings.Contains(table, "503"))                  // no refused sends in this model

	out.Reset()
	is.NoErr(Main([]string{"ours=" + ours}, &out, &bytes.Buffer{}))
	is.True(!strings.Contains(out.String(), "ours / River")) // no River run: no ratio table
	out.Reset()
	is.NoErr(Main([]string{"river=" + river}, &out, &bytes.Buffer{}))
	is.True(!strings.Contains(out.String(), "ours / River")) // nor without one of ours

	withErrors := strings.Replace(model, `"errors":0`, `"errors":0.02`, 1)
	out.Reset()
	is.NoErr(Main([]string{"ours=" + write(t, "e.json", `{"peer":"notifier","notifications":2000,"duplicates":0.1,"deliveries_per_sec":1800,"workers":1,`+withErrors+`,"check":"ok"}`)}, &out, &bytes.Buffer{}))
	is.True(strings.Contains(out.String(), "2% refused with 503")) // the refused share, described

	out.Reset()
	atOnce := write(t, "at-once.json", `{"peer":"notifier","notifications":2000,"duplicates":0.1,"deliveries_per_sec":1800,"workers":1,"call_latency":{"spec":"instant","seed":1},"check":"ok"}`)
	stalled := write(t, "stalled.json", `{"peer":"river","notifications":2000,"duplicates":0.1,"deliveries_per_sec":0,"workers":8,"call_latency":{"spec":"instant","seed":1},"check":"ok"}`)
	is.NoErr(Main([]string{"--json", "ours=" + atOnce, "river=" + stalled}, &out, &bytes.Buffer{}))
	res0 := Result{}
	is.NoErr(json.Unmarshal(out.Bytes(), &res0))
	_, ratioOfNothing := res0.Ratios["ours/river"]
	is.True(!ratioOfNothing) // a River that delivered nothing gives no ratio
	out.Reset()
	is.NoErr(Main([]string{"ours=" + atOnce}, &out, &bytes.Buffer{}))
	is.True(strings.Contains(out.String(), "answered at once") && !strings.Contains(out.String(), "lognormal")) // the instant model, described as such

	out.Reset()
	is.NoErr(Main([]string{"--json", "ours=" + ours, "river=" + river}, &out, &bytes.Buffer{}))
	var res Result
	is.NoErr(json.Unmarshal(out.Bytes(), &res))
	is.Equal(res.Ratios["ours/river"], 1.5) // the ratio, by name
	is.Equal(res.Runs[1].Window, 1000)      // River's window is MaxWorkers

	out.Reset()
	is.NoErr(Main([]string{"--window", ours}, &out, &bytes.Buffer{}))
	is.Equal(strings.TrimSpace(out.String()), "256") // for a River run of equal concurrency

	instant := write(t, "instant.json", `{"peer":"river","notifications":2000,"duplicates":0.1,"deliveries_per_sec":5000,"workers":8,"call_latency":{"spec":"instant","seed":1},"check":"ok"}`)
	err := Main([]string{"ours=" + ours, "river=" + instant}, &bytes.Buffer{}, &bytes.Buffer{})
	is.True(err != nil && strings.Contains(err.Error(), "not one workload")) // a ratio across models is refused

	failed := write(t, "failed.json", strings.Replace(`{"peer":"river","notifications":2000,"duplicates":0.1,"deliveries_per_sec":1200,"workers":8,`+model+`,"check":"ok"}`, `"check":"ok"`, `"check":"FAILED: 3 jobs, 2 completed"`, 1))
	out.Reset()
	err = Main([]string{"ours=" + ours, "river=" + failed}, &out, &bytes.Buffer{})
	is.True(err != nil && strings.Contains(err.Error(), "FAILED")) // a failed check fails the comparison
	is.True(strings.Contains(out.String(), "FAILED"))              // after printing it

	err = Main([]string{"ours=" + write(t, "x.json", `{"hello":1}`)}, &bytes.Buffer{}, &bytes.Buffer{})
	is.True(err != nil) // not a report
	var usage *UsageError
	err = Main(nil, &bytes.Buffer{}, &bytes.Buffer{})
	is.True(err != nil && errors.As(err, &usage)) // no reports: a usage error
}

func TestRounds(t *testing.T) {
	is := is.New(t)
	report := func(peer string, perSec, srv float64, autovacuums int) string {
		hot := 0.25
		if peer == "river" {
			hot = 0.5
		}
		return write(t, peer+".json", fmt.Sprintf(`{"peer":%q,"notifications":2000,"duplicates":0.1,"deliveries":4000,"deliveries_per_sec":%g,"workers":1,"window":1024,"server_cpu_ms_per_delivery":%g,"db_xacts_per_delivery":0.02,"hot_update_share":%g,"avg_in_flight":500,"autovacuums":%d,%s,"check":"ok"}`, peer, perSec, srv, hot, autovacuums, model))
	}
	args := []string{"--rounds",
		"ours=" + report("notifier", 3000, 0.2, 0), "river=" + report("river", 2000, 0.1, 2), // 1.50
		"ours=" + report("notifier", 2000, 0.3, 1), "river=" + report("river", 2500, 0.1, 0), // 0.80
		"ours=" + report("notifier", 4000, 0.1, 0), "river=" + report("river", 3200, 0.2, 0), // 1.25
	}
	var out bytes.Buffer
	is.NoErr(Main(args, &out, &bytes.Buffer{}))
	table := out.String()
	is.True(strings.Contains(table, "median 1.25, spread 0.80-1.50 over 3 rounds"))                // the middle ratio, not the mean's 1.18
	is.True(strings.Contains(table, "0.200/0.100"))                                                // median server CPU per delivery, ours/River
	is.True(strings.Contains(table, "  500/1024"))                                                 // calls in flight against the window
	is.True(strings.Contains(table, "\n3 "))                                                       // the third round, numbered
	is.True(strings.Contains(table, "ours 25%, River 50%"))                                        // the median HOT shares, in percent
	is.True(strings.Contains(table, "phase (their CPU is the server's): ours 0 1 0, River 2 0 0")) // autovacuums per round, in order
	is.True(!strings.Contains(table, "window bound"))                                              // no bound reported: none printed

	bounded := func(peer string, perSec, bound float64, window int) string {
		return write(t, peer+"-b.json", fmt.Sprintf(`{"peer":%q,"notifications":2000,"duplicates":0.1,"deliveries":4000,"deliveries_per_sec":%g,"workers":%d,"window":%d,"window_bound_per_sec":%g,%s,"check":"ok"}`, peer, perSec, window, window, bound, model))
	}
	out.Reset()
	is.NoErr(Main([]string{"--rounds",
		"ours=" + bounded("notifier", 4500, 6000, 1024), "river=" + bounded("river", 4000, 5400, 1000),
		"ours=" + bounded("notifier", 4600, 6000, 1024), "river=" + bounded("river", 4400, 5400, 1000),
	}, &out, &bytes.Buffer{}))
	table = out.String()
	is.True(strings.Contains(table, "ours 6000/s of 1024, River 5400/s of 1000")) // each peer's bound and window
	out.Reset()
	is.NoErr(Main([]string{"ours=" + bounded("notifier", 4500, 6000, 1024)}, &out, &bytes.Buffer{}))
	is.True(strings.Contains(out.String(), "    6000 "))                               // the bound beside the run
	is.True(strings.Contains(table, "ours 76%, River 78%; ours / River at most 1.43")) // medians 4550 and 4200: 6000 / 4200

	// The bound's lines need both bounds and River's pace: a run without a bound (--skip-calls, a
	// model with refused sends) or a River that delivered nothing prints none, rather than a ratio of
	// zeros.
	for _, c := range []struct{ oursBound, riverBound, riverPerSec float64 }{{0, 5400, 4000}, {6000, 0, 4000}, {6000, 5400, 0}} {
		out.Reset()
		is.NoErr(Main([]string{"--rounds", "ours=" + bounded("notifier", 4500, c.oursBound, 1024), "river=" + bounded("river", c.riverPerSec, c.riverBound, 1000)}, &out, &bytes.Buffer{}))
		is.True(!strings.Contains(out.String(), "window bound")) // nothing to bound by
	}

	err := Main(args[:len(args)-1], &out, &bytes.Buffer{}) // an odd count: no pairs
	var usage *UsageError
	is.True(errors.As(err, &usage))
	swapped := []string{"--rounds", args[2], args[1]} // River first
	is.True(errors.As(Main(swapped, &out, &bytes.Buffer{}), &usage))
	err = Main([]string{"--rounds", args[1], args[2], args[4], args[3]}, &out, &bytes.Buffer{})
	is.True(err != nil && strings.Contains(err.Error(), "round 2 is river then ours")) // names the round at fault

	out.Reset()
	stalledRiver := write(t, "stalled.json", `{"peer":"river","notifications":2000,"duplicates":0.1,"deliveries":0,"deliveries_per_sec":0,"workers":1,"window":1024,`+model+`,"check":"ok"}`)
	is.NoErr(Main([]string{"--rounds", "--json", args[1], "river=" + stalledRiver}, &out, &bytes.Buffer{}))
	var stalled RoundsResult
	is.NoErr(json.Unmarshal(out.Bytes(), &stalled))
	is.Equal(stalled.Rounds[0].Ratio, 0.0) // a River that delivered nothing: no ratio, not an infinite one
}
