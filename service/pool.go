package service

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// WorkerPlanCacheMode is the plan_cache_mode a worker's connections run with. The dispatcher's
// statements are prepared (pgx prepares every statement) and written to be planned once: a generic plan
// reads only waiting tasks and looks every row up by key (TestClaimGenericPlanLooksUpByKey). Left to
// itself (plan_cache_mode = auto), PostgreSQL planned TaskStartAttempts and TaskFinish again on every
// call, because their generic plans guess 10 elements per array parameter where a custom plan sees one:
// with the planning, the server spent twice the CPU per delivery (README "What limits throughput here").
const WorkerPlanCacheMode = "force_generic_plan"

// ConfigureWorkerConn sets WorkerPlanCacheMode on the connections of a worker's pool, unless the
// connection string chooses a plan_cache_mode itself (a parameter, or -c in options/PGOPTIONS).
func ConfigureWorkerConn(cfg *pgx.ConnConfig) {
	if _, ok := cfg.RuntimeParams["plan_cache_mode"]; ok || strings.Contains(cfg.RuntimeParams["options"], "plan_cache_mode") {
		return
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["plan_cache_mode"] = WorkerPlanCacheMode
}
