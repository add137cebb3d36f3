package workload

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WarmPool opens n connections of pool at once and returns them to it, so that both sides' measured
// phases start with their connections open: connecting is not part of the figures.
func WarmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		conns = append(conns, c)
	}
	return nil
}
