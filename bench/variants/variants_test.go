// Package variants holds variants of the schema for bench/variant.sh and bench/cost.sh: SQL files that
// drop what a redesign would move out of the delivery's hot path, to measure its ceiling before anyone
// writes it (docs/benchmarks/2026-12-05-row-costs.md). They are measurements, never migrations. This
// test keeps them applicable as schema/ changes.
package variants

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Each variant applies to a migrated database, as psql applies it in both scripts, and changes what it
// names: a variant that no longer applies, or that applies and changes nothing (a constraint renamed by
// a later migration, dropped with IF EXISTS), would measure the schema as it is under another name.
func TestVariantsApplyAndChangeTheSchema(t *testing.T) {
	files, err := filepath.Glob("*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no variants found")
	}
	binDir, _, err := pgtest.FindBinDir()
	if err != nil {
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(file, ".sql"), func(t *testing.T) {
			is := is.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			url := pgtest.NewDBURL(t)
			before := schemaOf(ctx, t, url)
			out, err := exec.CommandContext(ctx, filepath.Join(binDir, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
				"-f", file, url).CombinedOutput()
			if err != nil {
				t.Log(string(out))
			}
			is.NoErr(err) // the variant applies (psql's output is logged above)
			after := schemaOf(ctx, t, url)
			is.True(before != after) // and changes the tables it measures
		})
	}
}

// schemaOf lists the constraints, indexes and storage options of the tables a delivery writes.
func schemaOf(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, `
		SELECT string_agg(x, E'\n' ORDER BY x) FROM (
		    SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
		    WHERE conrelid IN ('delivery_task'::regclass, 'delivery_attempt'::regclass,
			                 'delivery_task_provider_msg'::regclass)
		    UNION ALL
		    SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index
		    WHERE indrelid IN ('delivery_task'::regclass, 'delivery_attempt'::regclass,
			                 'delivery_task_provider_msg'::regclass)
		    UNION ALL
		    SELECT 'options ' || relname || ' ' || coalesce(array_to_string(reloptions, ','), '') FROM pg_class
		    WHERE oid IN ('delivery_task'::regclass, 'delivery_attempt'::regclass,
			                 'delivery_task_provider_msg'::regclass)
		) AS s(x)`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
