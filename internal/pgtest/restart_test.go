package pgtest_test

// In the external test package: it waits with testworld.Eventually, and testworld imports pgtest.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
)

func TestClusterRestart(t *testing.T) {
	srv := pgtest.Cluster()
	if srv == nil {
		t.Skip("using an external database server")
	}
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	_, err := pool.Exec(ctx, "CREATE TABLE survives (x int); INSERT INTO survives VALUES (42)")
	is.NoErr(err)

	for _, immediate := range []bool{true, false} {
		is.NoErr(srv.Restart(ctx, immediate))
		var x int
		// The pool may first hand out a connection broken by the restart.
		testworld.Eventually(t, 10*time.Second, "the pool answers after the restart", func() bool {
			err = pool.QueryRow(ctx, "SELECT x FROM survives").Scan(&x)
			return err == nil
		})
		is.NoErr(err)
		is.Equal(x, 42)
	}

	is.NoErr(srv.Stop())
	is.NoErr(srv.Stop()) // idempotent
	_, err = pgx.Connect(ctx, srv.URL())
	is.True(err != nil) // connected to a stopped server
	is.NoErr(srv.Start(ctx))
	conn, err := pgx.Connect(ctx, srv.URL())
	is.NoErr(err)
	is.NoErr(conn.Close(ctx))
}
