package primary

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestHosts(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:p@db1:5432,db2:5433/notifier?target_session_attrs=read-write&sslmode=verify-full",
			"postgres://u:p@db1:5432/notifier?target_session_attrs=read-write&sslmode=verify-full postgres://u:p@db2:5433/notifier?target_session_attrs=read-write&sslmode=verify-full"},
		{"postgres://db1,db2/x", "postgres://db1/x postgres://db2/x"},
		{"postgresql://u@h:1", "postgresql://u@h:1"},
		{"postgres://u:p%40ss@[::1]:5432,10.0.0.2/db", "postgres://u:p%40ss@[::1]:5432/db postgres://u:p%40ss@10.0.0.2/db"},
		{"host=a,b dbname=x", "host=a,b dbname=x"},
	} {
		is := is.New(t)
		got, err := Hosts(c.in)
		is.NoErr(err)
		is.Equal(strings.Join(got, " "), c.want)
	}
	for _, bad := range []string{"postgres://u@/db", "postgres://u@a,,b/db"} {
		_, err := Hosts(bad)
		is.New(t).True(err != nil) // refused
	}
}

// The first host that takes writes wins: a host nobody listens on is passed over; a read-only server is
// refused.
func TestURLFindsThePrimary(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	writable := pgtest.NewDBURL(t)
	pool := pgtest.NewDB(t)
	readOnlyDB := pool.Config().ConnConfig.Database
	_, err := pool.Exec(ctx, `ALTER DATABASE "`+readOnlyDB+`" SET default_transaction_read_only = on`)
	is.NoErr(err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err)
	dead := l.Addr().String()
	is.NoErr(l.Close())

	// A host nobody listens on, then the server.
	server, err := url.Parse(writable)
	is.NoErr(err)
	multi := strings.Replace(writable, "@"+server.Host+"/", "@"+dead+","+server.Host+"/", 1)
	got, err := URL(ctx, multi, 3*time.Second)
	is.NoErr(err)
	is.Equal(got, writable) // the reachable, writable host, alone

	u, err := url.Parse(writable)
	is.NoErr(err)
	u.Path = "/" + readOnlyDB
	_, err = URL(ctx, u.String(), 3*time.Second)
	is.True(err != nil)                                 // no host takes writes
	is.True(strings.Contains(err.Error(), "read-only")) // and it says so
}
