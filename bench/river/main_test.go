package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// --phase-hook marks the measured deliver phase alone (bench/cost-vs-river.sh counts the server's work
// between the marks): at "start" every job of the run is inserted and none of them completed (the
// warm-up's are, and the warm-up is not marked), at "end" all are completed. A failing hook fails the
// run.
func TestPhaseHookBracketsTheDeliverPhase(t *testing.T) {
	url := pgtest.NewDBURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := parseFlags([]string{"--database-url", url, "--notifications", "50", "--warmup", "20",
		"--workers", "10", "--fetch-cooldown", "1ms", "--phase-hook", "true"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.phaseHook == nil {
		t.Fatal("--phase-hook: want a hook (workload.ShellHook)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var marks []string
	cfg.phaseHook = func(ctx context.Context, phase string) error {
		var completed, other int
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state <> 'completed')
			FROM river_job WHERE kind = $1`, jobKind).Scan(&completed, &other)
		marks = append(marks, fmt.Sprintf("%s: %d completed, %d not", phase, completed, other))
		return err
	}
	rep, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"start: 40 completed, 100 not", "end: 140 completed, 0 not"} // warm-up 20 x 2 before; 50 x 2 measured
	if strings.Join(marks, "; ") != strings.Join(want, "; ") {
		t.Errorf("marks %q, want %q", marks, want)
	}
	if rep.Check != "ok" || rep.Deliveries != 100 {
		t.Errorf("report: check %q, %d deliveries; want ok, 100", rep.Check, rep.Deliveries)
	}

	cfg.dbURL = pgtest.NewDBURL(t)
	cfg.notifications, cfg.warmup = 10, 0
	cfg.phaseHook = func(_ context.Context, phase string) error { return fmt.Errorf("hook refused %s", phase) }
	if _, err := run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "hook refused start") {
		t.Errorf("a failing hook: want the run to fail with it, got %v", err)
	}
}
