// Package testworld is the world the tests share: a migrated database with a pool set up as a
// worker's, the three fake channels, routes to them by mode, a dispatcher with short test defaults,
// and Eventually, the one wait for a condition. It is imported only by _test.go files: nothing in the
// binary depends on it.
package testworld

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// Eventually polls cond until it holds, with a back-off from 1 ms up to 20 ms between polls, and fails
// the test with what when it still does not hold after timeout: a wait for a fact, never a timed
// assertion (give it a generous timeout). Call it from the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// DeclaredModes are the modes the fake channels declare (docs/channels.md#the-fake-channels): push
// dedupes by key, sms answers queries, none can do neither.
var DeclaredModes = map[string]delivery.Mode{
	"push": delivery.ModeIdempotent,
	"sms":  delivery.ModeQueryable,
	"none": delivery.ModeNone,
}

// World is one test's world: its own migrated database and the three fake channels, closed and
// dropped when the test ends.
type World struct {
	t          testing.TB
	Pool       *pgxpool.Pool // the test's own database
	WorkerPool *pgxpool.Pool // the same database, connections set up as a worker's (service.ConfigureWorkerConn)
	Notifier   *service.Notifier
	Push       *fakes.Channel // IDEMPOTENT
	SMS        *fakes.Channel // QUERYABLE
	None       *fakes.Channel // NONE
}

// New builds t's world. Its methods fail t on any error.
func New(t testing.TB) *World {
	t.Helper()
	w := &World{t: t, Pool: pgtest.NewDB(t)}
	cfg, err := pgxpool.ParseConfig(w.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	service.ConfigureWorkerConn(cfg.ConnConfig)
	if w.WorkerPool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.WorkerPool.Close)
	w.Notifier = service.NewNotifier(w.Pool)
	w.Push, w.SMS, w.None = fakes.Start(fakes.Push), fakes.Start(fakes.SMS), fakes.Start(fakes.None)
	t.Cleanup(func() { w.Push.Close(); w.SMS.Close(); w.None.Close() })
	return w
}

// Fakes are the fake channels by name.
func (w *World) Fakes() map[string]*fakes.Channel {
	return map[string]*fakes.Channel{"push": w.Push, "sms": w.SMS, "none": w.None}
}

// Routes routes push, sms and none to their fakes through httpchannel clients, each with its declared
// mode unless modes overrides it (a negative control treats a channel as what it is not), and the
// contract and rate limit given for it (none when absent).
func (w *World) Routes(modes map[string]delivery.Mode, contracts map[string]delivery.Contract, rateLimits map[string]delivery.RateLimit) map[string]delivery.Route {
	w.t.Helper()
	routes := map[string]delivery.Route{}
	for name, fake := range w.Fakes() {
		client, err := httpchannel.New(fake.URL(), httpchannel.Options{})
		if err != nil {
			w.t.Fatal(err)
		}
		mode := DeclaredModes[name]
		if m, ok := modes[name]; ok {
			mode = m
		}
		routes[name] = delivery.Route{Mode: mode, Contract: contracts[name], Client: client, RateLimit: rateLimits[name]}
	}
	return routes
}

// Short test defaults of a dispatcher: a lease no test outlives by accident, a call timeout well above
// a fake's answer, and a backoff short enough that retries come within the test.
const (
	DefaultWorker      = "w-test"
	DefaultLease       = 10 * time.Second
	DefaultCallTimeout = 2 * time.Second
	DefaultBackoff     = 50 * time.Millisecond // the first retry; the longest is ten times it
)

// Dispatcher is a dispatcher on the worker pool with cfg, whose zero fields take the short test
// defaults (and every route of Routes without overrides).
func (w *World) Dispatcher(cfg service.DispatcherConfig) *service.Dispatcher {
	w.t.Helper()
	return w.DispatcherOn(w.WorkerPool, cfg)
}

// DispatcherOn is Dispatcher on another pool of the world's database (e.g. one running as a role).
func (w *World) DispatcherOn(pool *pgxpool.Pool, cfg service.DispatcherConfig) *service.Dispatcher {
	w.t.Helper()
	if cfg.Worker == "" {
		cfg.Worker = DefaultWorker
	}
	if cfg.Routes == nil {
		cfg.Routes = w.Routes(nil, nil, nil)
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Backoff.Base == 0 {
		cfg.Backoff.Base = DefaultBackoff
	}
	if cfg.Backoff.Max == 0 {
		cfg.Backoff.Max = 10 * cfg.Backoff.Base
	}
	d, err := service.NewDispatcher(context.Background(), pool, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return d
}

// User enables the given channels for user (address user@channel), and nothing else.
func (w *World) User(user string, channels ...string) {
	w.t.Helper()
	for _, ch := range channels {
		if _, err := w.Notifier.SetPreference(context.Background(), user, ch, user+"@"+ch, true); err != nil {
			w.t.Fatal(err)
		}
	}
}
