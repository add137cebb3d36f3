package load

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/notifierhq/notifier/bench/pgbench"
)

// pgbenchCompare runs pgbench unless it is off, or auto and pgbench is not found: one client per worker
// loop, each delivery one transaction of the per-task script. The ratio is the per-task target when
// the loops run --max-in-flight 1 --batch 1; otherwise it says how far the loop's batching goes
// beyond one task at a time.
func (b *bench) pgbenchCompare(ctx context.Context, rep *Report) error {
	if b.cfg.Pgbench == "off" {
		rep.PgbenchSkipped = "--pgbench=false"
		return nil
	}
	bin, err := pgbench.FindBin(os.Getenv)
	if err != nil {
		if b.cfg.Pgbench == "on" {
			return fmt.Errorf("--pgbench: %w", err)
		}
		rep.PgbenchSkipped = err.Error()
		b.notef("pgbench skipped: %v", err)
		return nil
	}
	scripts, cleanup, err := pgbench.Scripts(b.cfg.Scripts)
	if err != nil {
		return fmt.Errorf("--pgbench-scripts: %w", err)
	}
	defer cleanup()
	runner := pgbench.Runner{Bin: bin, Scripts: scripts, DBURL: b.cfg.DBURL, PlanCacheMode: rep.Server.PlanCacheMode,
		Clients: b.cfg.Workers, Server: b.server, Notef: b.notef}
	g, err := runner.Run(ctx, rep.Deliveries)
	if err != nil {
		return err
	}
	g.GoVsPgbench = ratio(rep.DeliveriesPerSec, g.TPS)
	rep.Pgbench = g
	b.notef("pgbench: %.0f tps; Go %.0f deliveries/s = %.2f x pgbench", g.TPS, rep.DeliveriesPerSec, g.GoVsPgbench)
	if b.cfg.Rounds < 2 {
		return nil
	}
	rep.Rounds = []roundReport{{Round: 1, Deliveries: rep.Deliveries, DeliveriesPerSec: pgbench.Round3(rep.DeliveriesPerSec),
		PgbenchTPS: g.TPS, GoVsPgbench: g.GoVsPgbench, CPUMSPerDelivery: pgbench.Round3(rep.CPUMSPerDelivery),
		ServerCPUMSPerDelivery: pgbench.Round3(rep.ServerCPUMSPerDelivery), PgbenchCPUMSPerDelivery: g.ClientCPUMSPerDelivery,
		PgbenchServerCPUMSPerDelivery: g.ServerCPUMSPerDelivery}}
	for n := 2; n <= b.cfg.Rounds; n++ {
		r, err := b.compareRound(ctx, n, runner)
		if err != nil {
			return err
		}
		rep.Rounds = append(rep.Rounds, r)
	}
	ratios := make([]float64, len(rep.Rounds))
	for i, r := range rep.Rounds {
		ratios[i] = r.GoVsPgbench
	}
	rep.MedianGoVsPgbench = pgbench.Round3(median(ratios))
	b.notef("rounds: Go / pgbench %v, median %.2f", ratios, rep.MedianGoVsPgbench)
	return nil
}

// roundReport is one Go deliver phase and the pgbench run after it (--rounds).
type roundReport struct {
	Round                         int     `json:"round"`
	Deliveries                    int     `json:"deliveries"`
	DeliveriesPerSec              float64 `json:"deliveries_per_sec"`
	PgbenchTPS                    float64 `json:"pgbench_tps"`
	GoVsPgbench                   float64 `json:"go_vs_pgbench"`
	CPUMSPerDelivery              float64 `json:"cpu_ms_per_delivery"`
	ServerCPUMSPerDelivery        float64 `json:"server_cpu_ms_per_delivery,omitempty"`
	PgbenchCPUMSPerDelivery       float64 `json:"pgbench_cpu_ms_per_delivery"`
	PgbenchServerCPUMSPerDelivery float64 `json:"pgbench_server_cpu_ms_per_delivery,omitempty"`
}

// compareRound is one more pair after the first: --notifications created (no duplicates: only the
// deliveries are compared), delivered by the workers, then as many replayed by pgbench. Alternating
// the two sides makes a machine whose speed drifts (shared cores) weigh on both alike.
func (b *bench) compareRound(ctx context.Context, n int, runner pgbench.Runner) (roundReport, error) {
	label := fmt.Sprintf("round%d", n)
	cs, err := b.createAll(ctx, label, b.cfg.Notifications, 0)
	if err != nil {
		return roundReport{}, err
	}
	if err := b.analyze(ctx); err != nil {
		return roundReport{}, err
	}
	ds, err := b.deliver(ctx, label+" deliver", cs.tasks, b.cfg.loop(), nil)
	if err != nil {
		return roundReport{}, err
	}
	client, server := ds.cpuMSPerDelivery()
	r := roundReport{Round: n, Deliveries: ds.sent, DeliveriesPerSec: pgbench.Round3(float64(ds.sent) / ds.seconds),
		CPUMSPerDelivery: pgbench.Round3(client), ServerCPUMSPerDelivery: pgbench.Round3(server)}
	g, err := runner.Run(ctx, ds.sent)
	if err != nil {
		return roundReport{}, err
	}
	r.PgbenchTPS, r.GoVsPgbench = g.TPS, ratio(r.DeliveriesPerSec, g.TPS)
	r.PgbenchCPUMSPerDelivery, r.PgbenchServerCPUMSPerDelivery = g.ClientCPUMSPerDelivery, g.ServerCPUMSPerDelivery
	b.notef("round %d: Go %.0f deliveries/s, pgbench %.0f tps = %.2f", n, r.DeliveriesPerSec, r.PgbenchTPS, r.GoVsPgbench)
	return r, nil
}

// median of xs (not empty); xs is sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
