package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Passwords of the test users (hashed at bcrypt's minimum cost: the tests sign in often).
const (
	alicePassword = "alice-correct-horse"
	bobPassword   = "bob-battery-staple"
)

// syncBuffer is a log shared by the server's goroutines and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lines are the log's lines containing s.
func (b *syncBuffer) lines(s string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// fixture is a console on a fresh migrated database, connected as a login of the operator role (as
// production runs it), with a pool as the owner for setting up and checking rows.
type fixture struct {
	t     *testing.T
	owner *pgxpool.Pool
	srv   *Server
	log   *syncBuffer
	now   *clock0
}

// clock0 is a settable clock for the session and login-limit expiries.
type clock0 struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock0) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock0) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newFixture builds a console; change adjusts its Config before New (nil: users alice and bob, Secure
// cookies).
func newFixture(t *testing.T, change func(*Config)) *fixture {
	t.Helper()
	dbURL := pgtest.NewDBURL(t)
	owner, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name, password := newLogin(t, owner, service.RoleOperator)
	u.User = url.UserPassword(name, password)
	operator, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(operator.Close)
	f := &fixture{t: t, owner: owner, log: &syncBuffer{}, now: &clock0{t: time.Now()}}
	cfg := Config{
		Notifier: service.NewNotifier(operator),
		Log:      slog.New(slog.NewTextHandler(io.MultiWriter(f.log, testWriter{t}), nil)),
		Users: Users{
			"alice": mustHash(t, alicePassword),
			"bob":   mustHash(t, bobPassword),
		},
		SecureCookie: true,
		Now:          f.now.Now,
	}
	if change != nil {
		change(&cfg)
	}
	f.srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// testWriter shows the server's log in the test's output (go test -v).
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func mustHash(t *testing.T, password string) []byte {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// newLogin creates a LOGIN role in group for this test only (roles are cluster-wide: a random name,
// dropped at the end), as cli's tests do.
func newLogin(t *testing.T, pool *pgxpool.Pool, group string) (name, password string) {
	t.Helper()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name, password = "notifier_console_"+hex.EncodeToString(suffix), hex.EncodeToString(suffix)+"-pw"
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{name}.Sanitize()+` LOGIN PASSWORD '`+password+`' IN ROLE `+
		pgx.Identifier{group}.Sanitize()); err != nil {
		t.Fatalf("create login role in %s: %v", group, err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("drop login role %s: %v", name, err)
		}
	})
	return name, password
}

// parkedTask makes one parked task of user on channel with body (test-only SQL, as the owner, by the
// protocol's moves: claimed, timed out, parked) and returns its id.
func (f *fixture) parkedTask(channel, user, body string) int64 {
	f.t.Helper()
	ctx := context.Background()
	var id int64
	err := f.owner.QueryRow(ctx, `
		WITH n AS (INSERT INTO notification (user_id, event_key, body, expires_at)
		           VALUES ($1, 'order-' || left(gen_random_uuid()::text, 8), $2, now() + interval '1 hour') RETURNING id)
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                           attempt_token, lease_owner, lease_until)
		SELECT id, $3, 'SENDING', 1, 3, NULL, gen_random_uuid(), 'worker-a', now() + interval '1 hour' FROM n
		RETURNING id`, user, body, channel).Scan(&id)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, started_at)
		 SELECT id, 1, attempt_token, 'SEND', 'worker-a', now() - interval '2 minutes' FROM delivery_task WHERE id = $1`,
		`UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now() - interval '2 minutes' + interval '10 seconds',
		        error = 'no answer within 10s' WHERE task_id = $1`,
		`UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true, outcome_uncertain = true, uncertain_since = updated_at,
		        lease_owner = NULL, lease_until = NULL, last_error = 'no answer within 10s' WHERE id = $1`,
	} {
		if _, err := f.owner.Exec(ctx, stmt, id); err != nil {
			f.t.Fatalf("%s: %v", stmt, err)
		}
	}
	return id
}

// taskRow is what the database holds of a task after the console acted on it.
type taskRow struct {
	state       string
	needsReview bool
	manual      int    // MANUAL attempts
	operator    string // the last MANUAL attempt's worker
	note        string
}

func (f *fixture) task(id int64) taskRow {
	f.t.Helper()
	var r taskRow
	err := f.owner.QueryRow(context.Background(), `
		SELECT t.state, t.needs_review,
		       (SELECT count(*) FROM delivery_attempt a WHERE a.task_id = t.id AND a.action = 'MANUAL'),
		       coalesce((SELECT a.worker FROM delivery_attempt a WHERE a.task_id = t.id AND a.action = 'MANUAL' ORDER BY attempt_no DESC LIMIT 1), ''),
		       coalesce((SELECT a.note FROM delivery_attempt a WHERE a.task_id = t.id AND a.action = 'MANUAL' ORDER BY attempt_no DESC LIMIT 1), '')
		FROM delivery_task t WHERE t.id = $1`, id).Scan(&r.state, &r.needsReview, &r.manual, &r.operator, &r.note)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// client is a browser without a browser: a cookie jar, no redirects followed, over an httptest server.
type client struct {
	t    *testing.T
	base string
	http *http.Client
}

// serve serves the console over TLS (a cookie jar returns Secure cookies over HTTPS only).
func (f *fixture) serve() *httptest.Server {
	ts := httptest.NewTLSServer(f.srv.Handler())
	f.t.Cleanup(ts.Close)
	return ts
}

func (f *fixture) client(ts *httptest.Server) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: f.t, base: ts.URL, http: &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: ts.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is one answer, its body read.
type page struct {
	code   int
	header http.Header
	body   string
}

func (c *client) get(path string) page {
	c.t.Helper()
	resp, err := c.http.Get(c.base + path)
	return c.read(resp, err)
}

func (c *client) post(path string, form url.Values) page {
	c.t.Helper()
	resp, err := c.http.PostForm(c.base+path, form)
	return c.read(resp, err)
}

func (c *client) read(resp *http.Response, err error) page {
	c.t.Helper()
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return page{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token is the CSRF token of the page's first form.
func (p page) token(t *testing.T) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no csrf field in %d page:\n%s", p.code, p.body)
	}
	return m[1]
}

// signIn signs c in as user and returns the list page's CSRF token.
func (c *client) signIn(user, password string) string {
	c.t.Helper()
	login := c.get("/login")
	p := c.post("/login", url.Values{"csrf": {login.token(c.t)}, "user": {user}, "password": {password}})
	if p.code != http.StatusSeeOther || p.header.Get("Location") != "/" {
		c.t.Fatalf("sign in as %s: %d %s\n%s", user, p.code, p.header.Get("Location"), p.body)
	}
	return c.get("/").token(c.t)
}
