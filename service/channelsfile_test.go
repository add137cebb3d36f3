package service_test

import (
	"os"
	"path/filepath"
	"time"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
)

// channelsFileDispatcher serves the channels of a channels file (file, its TOML text; getenv answers
// its _env keys) as worker, with the provider tests' short lease, call timeout and backoff; configure
// changes the configuration before the dispatcher is built.
func (e *env) channelsFileDispatcher(worker, file string, getenv func(string) string, configure ...func(*service.DispatcherConfig)) *dispatcher {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "channels.toml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		e.t.Fatal(err)
	}
	routes, err := channelconfig.Load(path, getenv)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := service.DispatcherConfig{Worker: worker, Routes: routes,
		Lease: 10 * time.Second, CallTimeout: 300 * time.Millisecond,
		Backoff: delivery.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond}}
	for _, c := range configure {
		c(&cfg)
	}
	d, err := service.NewDispatcher(e.ctx, e.workerPool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return &dispatcher{Dispatcher: d}
}
