package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
)

// TestBadInput: every malformed command line exits 2 with one line on stderr, prints nothing on
// stdout, and writes nothing (a due task stays unclaimed).
func TestBadInput(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err) // a preference
	_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "due-1", Body: "body", TTL: time.Hour, MaxAttempts: 3})
	is.New(t).NoErr(err) // and a due task a worker could claim
	before := rowCounts(t, pool)
	good := "push=idempotent," + push.URL()

	cases := []struct {
		name string
		args []string
		want string // part of the error line
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown global flag", []string{"--bogus", "status"}, "-bogus"},
		{"unknown command flag", []string{"status", "--bogus"}, "-bogus"},
		{"unknown subcommand", []string{"pref", "get"}, `unknown command "get"`},
		{"missing subcommand", []string{"pref"}, "subcommand"},
		{"stray argument", []string{"status", "now"}, `unexpected argument "now"`},
		{"bad log level", []string{"--log-level", "loud", "status"}, "--log-level"},
		{"bad log format", []string{"--log-format", "xml", "status"}, "--log-format"},
		{"pref missing address", []string{"pref", "set", "--user", "u2", "--channel", "sms"}, "--address"},
		{"pref bad enabled", []string{"pref", "set", "--user", "u2", "--channel", "sms", "--address", "a", "--enabled=maybe"}, "enabled"},
		{"pref bad channel name", []string{"pref", "set", "--user", "u2", "--channel", "SMS!", "--address", "a"}, "channel"},
		{"create missing user", []string{"create", "--event-key", "k", "--body", "b"}, "--user"},
		{"create missing body", []string{"create", "--user", "u1", "--event-key", "k"}, "--body"},
		{"create negative ttl", []string{"create", "--user", "u1", "--event-key", "k", "--body", "b", "--ttl", "-5s"}, "ttl"},
		{"create bad ttl", []string{"create", "--user", "u1", "--event-key", "k", "--body", "b", "--ttl", "soon"}, "ttl"},
		{"create zero attempts", []string{"create", "--user", "u1", "--event-key", "k", "--body", "b", "--max-attempts", "0"}, "max attempts"},
		{"create blank user", []string{"create", "--user", " ", "--event-key", "k", "--body", "b"}, "user"},
		{"create empty body on stdin", []string{"create", "--user", "u1", "--event-key", "k", "--body", "-"}, "body"},
		{"create blank body", []string{"create", "--user", "u1", "--event-key", "k", "--body", " \n"}, "body"},
		{"resolve unknown state", []string{"resolve", "--task", "1", "--state", "MAYBE", "--note", "n"}, `--state "MAYBE"`},
		{"resolve missing note", []string{"resolve", "--task", "1", "--state", "SENT"}, "--note"},
		{"resolve bad task", []string{"resolve", "--task", "abc", "--state", "SENT", "--note", "n"}, "task"},
		{"resolve blank note", []string{"resolve", "--task", "1", "--state", "SENT", "--note", " "}, "note"},
		{"cancel missing event key", []string{"cancel", "--user", "u1"}, "--event-key"},
		{"cancel blank user", []string{"cancel", "--user", " ", "--event-key", "k"}, "user"},
		{"cancel empty note", []string{"cancel", "--user", "u1", "--event-key", "k", "--note", ""}, "--note"},
		{"cancel note too long", []string{"cancel", "--user", "u1", "--event-key", "k", "--note", strings.Repeat("n", 2001)}, "note"},
		{"review bad limit", []string{"review", "--limit", "0"}, "--limit"},
		{"work no channel", []string{"work", "--once"}, "--channel"},
		{"work channel without =", []string{"work", "--once", "--channel", "push"}, `--channel "push"`},
		{"work channel without comma", []string{"work", "--once", "--channel", "push=idempotent"}, "no URL"},
		{"work channel unknown mode", []string{"work", "--once", "--channel", "push=sometimes," + push.URL()}, `unknown mode "sometimes"`},
		{"work channel bad URL", []string{"work", "--once", "--channel", "push=idempotent,ftp://u:hunter2@example.com"}, "channel URL"},
		{"work channel empty URL", []string{"work", "--once", "--channel", "push=idempotent,"}, "empty URL"},
		{"work channel bad name", []string{"work", "--once", "--channel", "Push!=idempotent," + push.URL()}, "channel"},
		{"work duplicate channel", []string{"work", "--once", "--channel", good, "--channel", "push=none," + push.URL()}, "given twice"},
		{"work lease overlap", []string{"work", "--once", "--channel", good, "--lease", "3s", "--timeout", "2s"}, "--allow-lease-overlap"},
		{"work old --concurrency", []string{"work", "--channel", good, "--concurrency", "2"}, "--max-in-flight"},
		{"work old --channels", []string{"work", "--once", "--channels", "x.toml"}, "--channels-file"},
		{"work zero max in flight", []string{"work", "--channel", good, "--max-in-flight", "0"}, "--max-in-flight"},
		{"work zero finishers", []string{"work", "--channel", good, "--finishers", "0"}, "--finishers"},
		{"work pool over a quarter of max_connections", []string{"work", "--channel", good, "--finishers", "64"}, "max_connections"},
		{"work batch with once", []string{"work", "--once", "--channel", good, "--batch", "2"}, "--batch"},
		{"work batch too large", []string{"work", "--channel", good, "--batch", "100000"}, "--batch"},
		{"work bad metrics addr", []string{"work", "--once", "--channel", good, "--metrics-addr", "nowhere"}, "--metrics-addr"},
		{"fake bad listen", []string{"fake", "--listen", "nowhere"}, "--listen"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", tc.args...)
			is.Equal(r.code, 2)                             // usage or bad input
			oneErrorLine(t, r)                              // one clear line
			is.True(strings.Contains(r.stderr, tc.want))    // naming what is wrong
			is.True(!strings.Contains(r.stderr, "hunter2")) // never a URL password
			is.Equal(r.stdout, "")                          // no result
			is.Equal(rowCounts(t, pool), before)            // nothing written
			is.Equal(push.TotalSends(), 0)                  // nothing sent
		})
	}
}

// TestUnreachableDatabase: exit 1, one clear line, and the password never shows.
func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	push := startFake(t, fakes.Push)
	c := notifierCLI{t: t}
	const dbURL = "postgres://u:secret@127.0.0.1:1/x?sslmode=disable&connect_timeout=5"
	commands := [][]string{
		{"status"},
		{"review"},
		{"pref", "set", "--user", "u1", "--channel", "push", "--address", "a"},
		{"create", "--user", "u1", "--event-key", "k", "--body", "b"},
		{"resolve", "--task", "1", "--state", "SENT", "--note", "n"},
		{"cancel", "--user", "u1", "--event-key", "k"},
		{"work", "--once", "--channel", "push=idempotent," + push.URL()},
		{"work", "--wait-for-database", "0", "--channel", "push=idempotent," + push.URL()},
	}
	for _, args := range commands {
		t.Run(strings.Join(args[:1], " "), func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", append([]string{"--database-url", dbURL}, args...)...)
			is.Equal(r.code, 1)                                         // a runtime error
			oneErrorLine(t, r)                                          // one line
			is.True(strings.Contains(r.stderr, "database unreachable")) // saying what is wrong
			is.True(!strings.Contains(r.stdout+r.stderr, "secret"))     // never the password
		})
	}

	t.Run("no database", func(t *testing.T) {
		is := is.New(t)
		r := c.in(t).run("", "status")
		is.Equal(r.code, 2)                                                               // a missing setting is a usage error
		oneErrorLine(t, r)                                                                // one line
		is.Equal(r.stderr, "notifier: no database: set --database-url or DATABASE_URL\n") // saying how to fix it
	})

	t.Run("bad URL", func(t *testing.T) {
		is := is.New(t)
		r := c.in(t).run("", "--database-url", "postgres://u:secret@127.0.0.1:1/x?sslmode=sometimes", "status")
		is.Equal(r.code, 2)                                     // a bad value
		oneErrorLine(t, r)                                      // one line
		is.True(!strings.Contains(r.stdout+r.stderr, "secret")) // never the password
	})
}

// TestPasswordsNeverShown: the reported leaks. A database or channel URL whose password holds '@',
// '/', a space or a quote, or a key=value string with broken quoting, is refused (exit 2) with one line
// that shows no piece of the password.
func TestPasswordsNeverShown(t *testing.T) {
	t.Parallel()
	c := notifierCLI{t: t}
	const noDB = "postgres://u@127.0.0.1:1/db?connect_timeout=2"
	cases := []struct {
		name   string
		args   []string
		code   int      // 2: refused as bad input; 1: valid, and then the database is unreachable
		pieces []string // no piece of the password may show
	}{
		{"URL password with @", []string{"--database-url", "postgres://u:S3cr@tPass!@127.0.0.1:1/db", "status"}, 2, []string{"S3cr", "tPass"}},
		{"URL password with /", []string{"--database-url", "postgres://u:12/ss@127.0.0.1:1/db", "status"}, 2, []string{"12/", "ss@"}},
		{"URL password with a space", []string{"--database-url", "postgres://u:pa ss@127.0.0.1:1/db", "status"}, 2, []string{"pa ss", "ss@"}},
		{"URL password encoded", []string{"--database-url", "postgres://u:S3cr%40tPass!@127.0.0.1:1/db?connect_timeout=2", "status"}, 1, []string{"S3cr", "tPass"}},
		{"key=value unterminated quote", []string{"--database-url", "host=127.0.0.1 user=u password='abc def dbname=x", "status"}, 2, []string{"abc", "def"}},
		{"key=value escaped space", []string{"--database-url", `host=127.0.0.1 password=abc\ def sslmode=bogus`, "status"}, 2, []string{"abc", "def"}},
		{"channel password with @", []string{"--database-url", noDB, "work", "--once", "--channel", "push=idempotent,http://user:p@ss@127.0.0.1:8081"}, 1, []string{"p@ss"}},
		{"channel password with /", []string{"work", "--once", "--channel", "push=idempotent,http://user:12/ss@127.0.0.1:8081"}, 2, []string{"12/ss", "ss@"}},
		{"channel password with a space", []string{"work", "--once", "--channel", "push=idempotent,http://user:pa ss@127.0.0.1:8081"}, 2, []string{"pa ss", "ss@"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", tc.args...)
			t.Log(r.stderr)
			is.Equal(r.code, tc.code) // refused as bad input, or failing on the unreachable database
			oneErrorLine(t, r)        // one line
			for _, p := range tc.pieces {
				is.True(!strings.Contains(r.stdout+r.stderr, p)) // no piece of the password
			}
			if tc.code == 2 {
				is.True(strings.Contains(r.stderr, "xxxxx")) // the refused value is shown, masked
			}
		})
	}
}
