package service

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"
)

func TestConfigureWorkerConn(t *testing.T) {
	for _, c := range []struct {
		name, url, want string
	}{
		{"default", "postgres://u@localhost/db", WorkerPlanCacheMode},
		{"a parameter of the URL wins", "postgres://u@localhost/db?plan_cache_mode=auto", "auto"},
		{"options (or PGOPTIONS) win", "postgres://u@localhost/db?options=-c%20plan_cache_mode%3Dforce_custom_plan", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			cfg, err := pgx.ParseConfig(c.url)
			is.NoErr(err) // config parses
			ConfigureWorkerConn(cfg)
			is.Equal(cfg.RuntimeParams["plan_cache_mode"], c.want) // the startup parameter sent, if any
		})
	}
}
