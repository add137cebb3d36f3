package pgha

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Observe samples, every interval until ctx ends, what the monitor and each node say about
// replication, and calls logf with a line each time a sample differs from the one before: the
// monitor's reported/goal state of each node and its formation's number_sync_standbys, and per node
// pg_is_in_recovery(), synchronous_standby_names, pg_stat_replication (application_name, state,
// sync_state) and how many backends wait for a synchronous standby (wait_event SyncRep). A commit
// blocked on a standby that is gone shows up as syncrep waits > 0 with no sync row. It returns when
// ctx ends.
func (c *Cluster) Observe(ctx context.Context, interval time.Duration, logf func(format string, args ...any)) {
	last := ""
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		line := c.sample(ctx)
		if line != last {
			logf("pgha observe %s %s", time.Now().Format("15:04:05.000"), line)
			last = line
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sample is one line of Observe.
func (c *Cluster) sample(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var b strings.Builder
	b.WriteString("monitor[")
	if states, err := c.State(qctx); err != nil {
		b.WriteString("error")
	} else {
		for i, s := range states {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%s:%s/%s", s.Name, s.Reported, s.Goal)
		}
	}
	var nss int
	if err := c.mon.QueryRow(qctx, `SELECT number_sync_standbys FROM pgautofailover.formation WHERE formationid = 'default'`).Scan(&nss); err == nil {
		fmt.Fprintf(&b, " number_sync_standbys=%d", nss)
	}
	b.WriteString("]")
	for _, n := range c.nodes {
		fmt.Fprintf(&b, " %s[%s]", n.Name, n.replicationState(ctx))
	}
	return b.String()
}

// replicationState is what node n says of its replication, or why it did not answer.
func (n *Node) replicationState(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL()+"&connect_timeout=1")
	if err != nil {
		return "down"
	}
	defer conn.Close(context.Background())
	var (
		recovery bool
		names    string
		repl     string
		waits    int
	)
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
		coalesce((SELECT string_agg(application_name || ':' || state || ':' || sync_state, ',' ORDER BY application_name) FROM pg_stat_replication), ''),
		(SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep')`).Scan(&recovery, &names, &repl, &waits)
	if err != nil {
		return "error"
	}
	role := "primary"
	if recovery {
		role = "standby"
	}
	return fmt.Sprintf("%s ssn=%q repl=%q syncrep_waits=%d", role, names, repl, waits)
}
