package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/bcrypt"

	"github.com/notifierhq/notifier/dbgen"
)

// TestHeadersOnEveryAnswer: the sign-in page, a signed-in page, an error and the stylesheet all carry
// the strict CSP and the no-sniff, no-frame, no-referrer, no-store headers; no page holds a script.
func TestHeadersOnEveryAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ts := f.serve()
	c := f.client(ts)
	c.signIn("alice", alicePassword)
	for _, path := range []string{"/login", "/", "/status", "/task/999999", "/nowhere", "/static/console.css"} {
		t.Run(path, func(t *testing.T) {
			is := is.New(t)
			p := c.get(path)
			is.Equal(p.header.Get("Content-Security-Policy"),
				"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
			is.Equal(p.header.Get("X-Content-Type-Options"), "nosniff")
			is.Equal(p.header.Get("X-Frame-Options"), "DENY")
			is.Equal(p.header.Get("Referrer-Policy"), "no-referrer")
			is.Equal(p.header.Get("Cache-Control"), "no-store")
			is.True(!strings.Contains(strings.ToLower(p.body), "<script")) // nothing that would need 'unsafe-inline'
			is.True(!strings.Contains(strings.ToLower(p.body), " style="))
		})
	}
}

// TestCookieFlags: the session cookie (and the sign-in form's) is HttpOnly, SameSite=Strict, Secure with
// the __Host- prefix; with SecureCookie off (--insecure-listen) neither Secure nor the prefix.
func TestCookieFlags(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{true, false} {
		t.Run("secure="+strconv.FormatBool(secure), func(t *testing.T) {
			is := is.New(t)
			f := newFixture(t, func(c *Config) { c.SecureCookie = secure })
			h := f.srv.Handler()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/login", nil))
			login := rec.Result().Cookies()
			is.Equal(len(login), 1)
			token := csrfField.FindStringSubmatch(rec.Body.String())[1]
			form := url.Values{"csrf": {token}, "user": {"alice"}, "password": {alicePassword}}
			req := httptest.NewRequest("POST", "/login", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.AddCookie(login[0])
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			is.Equal(rec.Code, http.StatusSeeOther)
			var session *http.Cookie
			for _, c := range rec.Result().Cookies() {
				if strings.HasSuffix(c.Name, "notifier_console") {
					session = c
				}
			}
			is.True(session != nil)
			for _, c := range []*http.Cookie{login[0], session} {
				is.True(c.HttpOnly)
				is.Equal(c.SameSite, http.SameSiteStrictMode)
				is.Equal(c.Secure, secure)
				is.Equal(c.Path, "/")
				is.Equal(strings.HasPrefix(c.Name, "__Host-"), secure)
			}
			is.True(len(session.Value) >= 43) // 256 random bits
		})
	}
}

// TestUnauthenticated: pages redirect to the sign-in page, a POST is refused, and nothing changes.
func TestUnauthenticated(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	id := f.parkedTask("push", "u1", "hello")
	c := f.client(f.serve())
	for _, path := range []string{"/", "/status", "/task/" + strconv.FormatInt(id, 10)} {
		p := c.get(path)
		is.Equal(p.code, http.StatusSeeOther)
		is.Equal(p.header.Get("Location"), "/login")
	}
	p := c.post("/task/"+strconv.FormatInt(id, 10)+"/resolve", url.Values{"state": {"SENT"}, "note": {"n"}})
	is.Equal(p.code, http.StatusForbidden)
	is.Equal(f.task(id).state, "UNKNOWN") // still parked
	// A made-up session id is no session.
	jarURL, _ := url.Parse(c.base)
	c.http.Jar.SetCookies(jarURL, []*http.Cookie{{Name: "__Host-notifier_console", Value: "forged", Path: "/", Secure: true}})
	is.Equal(c.get("/").code, http.StatusSeeOther)
}

// TestWrongPasswordRefused: a wrong password or an unknown user gets 401 and no session.
func TestWrongPasswordRefused(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	c := f.client(f.serve())
	for _, who := range [][2]string{{"alice", bobPassword}, {"mallory", alicePassword}, {"alice", ""}} {
		login := c.get("/login")
		p := c.post("/login", url.Values{"csrf": {login.token(t)}, "user": {who[0]}, "password": {who[1]}})
		is.Equal(p.code, http.StatusUnauthorized)
		is.True(strings.Contains(p.body, "Wrong user name or password."))
		is.Equal(c.get("/").code, http.StatusSeeOther) // still signed out
	}
	is.Equal(len(f.log.lines("sign-in refused: wrong user name or password")), 3)
}

// TestSignInNeedsItsToken: a sign-in post without the form's token (a login CSRF) is refused.
func TestSignInNeedsItsToken(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	c := f.client(f.serve())
	c.get("/login") // has the cookie, but posts no token
	p := c.post("/login", url.Values{"user": {"alice"}, "password": {alicePassword}})
	is.Equal(p.code, http.StatusForbidden)
	p = c.post("/login", url.Values{"csrf": {"guessed"}, "user": {"alice"}, "password": {alicePassword}})
	is.Equal(p.code, http.StatusForbidden)
	is.Equal(c.get("/").code, http.StatusSeeOther) // not signed in
}

// TestLoginRateLimited: after five wrong passwords for alice from one address, even the right one is
// refused (429) from there until the window has passed; bob, and alice from another address, are not
// affected.
func TestLoginRateLimited(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	h := f.srv.Handler()
	try := func(user, password, addr string) int { return tryLogin(t, h, user, password, addr).Code }
	const here, there = "192.0.2.1:5000", "192.0.2.2:5000"
	for range loginFailures {
		is.Equal(try("alice", "wrong", here), http.StatusUnauthorized)
	}
	is.Equal(try("alice", alicePassword, here), http.StatusTooManyRequests) // the right password, refused
	is.Equal(try("alice", "wrong", here), http.StatusTooManyRequests)
	is.Equal(try("bob", bobPassword, here), http.StatusSeeOther)      // another user from there
	is.Equal(try("alice", alicePassword, there), http.StatusSeeOther) // alice from elsewhere
	f.now.advance(loginWindow + time.Second)
	is.Equal(try("alice", alicePassword, here), http.StatusSeeOther) // the window has passed
}

// tryLogin fetches the sign-in form from addr and posts user and password with its token.
func tryLogin(t *testing.T, h http.Handler, user, password, addr string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/login", nil)
	req.RemoteAddr = addr
	h.ServeHTTP(rec, req)
	token := csrfField.FindStringSubmatch(rec.Body.String())[1]
	cookie := rec.Result().Cookies()[0]
	form := url.Values{"csrf": {token}, "user": {user}, "password": {password}}
	req = httptest.NewRequest("POST", "/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = addr
	req.AddCookie(cookie)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// countBcrypt makes the console count its password comparisons (and skip bcrypt's cost: the limits,
// not the hashing, are under test).
func countBcrypt(srv *Server) *atomic.Int64 {
	var n atomic.Int64
	srv.compare = func(hash, password []byte) error {
		n.Add(1)
		if string(password) == alicePassword {
			return nil
		}
		return bcrypt.ErrMismatchedHashAndPassword
	}
	return &n
}

// TestLoginAttemptsPerAddressLimited: many user names from one address reach the per-address limit
// (the per-user count never does); the next attempt is 429 with Retry-After and runs no bcrypt, while
// another address still signs in; the next window admits the address again.
func TestLoginAttemptsPerAddressLimited(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	runs := countBcrypt(f.srv)
	h := f.srv.Handler()
	const here, there = "192.0.2.1:5000", "192.0.2.2:5000"
	for i := range loginAttemptsPerAddress {
		is.Equal(tryLogin(t, h, "user"+strconv.Itoa(i), "guess", here).Code, http.StatusUnauthorized)
	}
	is.Equal(runs.Load(), int64(loginAttemptsPerAddress)) // one bcrypt per admitted attempt
	rec := tryLogin(t, h, "alice", alicePassword, here)
	is.Equal(rec.Code, http.StatusTooManyRequests)                                    // over the address's limit
	is.Equal(rec.Header().Get("Retry-After"), "60")                                   // the window's rest
	is.Equal(runs.Load(), int64(loginAttemptsPerAddress))                             // no bcrypt for it
	is.Equal(tryLogin(t, h, "alice", alicePassword, there).Code, http.StatusSeeOther) // another address
	f.now.advance(30 * time.Second)
	is.Equal(tryLogin(t, h, "alice", alicePassword, here).Header().Get("Retry-After"), "30")
	f.now.advance(30 * time.Second)
	is.Equal(tryLogin(t, h, "alice", alicePassword, here).Code, http.StatusSeeOther) // a new window
	is.Equal(testutil.ToFloat64(f.srv.metrics.signIns.WithLabelValues("rate_limited_address")), 2.0)
}

// TestLoginAttemptsGloballyLimited: attempts from many addresses reach the global limit; then an
// attempt from any address, even with the right password, is 429 and runs no bcrypt.
func TestLoginAttemptsGloballyLimited(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	runs := countBcrypt(f.srv)
	h := f.srv.Handler()
	for i := range loginAttemptsGlobal {
		addr := "198.51.100." + strconv.Itoa(i%250+1) + ":4000"
		is.Equal(tryLogin(t, h, "bob", "guess", addr).Code, http.StatusUnauthorized)
	}
	is.Equal(runs.Load(), int64(loginAttemptsGlobal))
	rec := tryLogin(t, h, "alice", alicePassword, "203.0.113.9:4000") // a fresh address
	is.Equal(rec.Code, http.StatusTooManyRequests)
	is.True(rec.Header().Get("Retry-After") != "")
	is.Equal(runs.Load(), int64(loginAttemptsGlobal)) // no bcrypt for the refused attempt
	is.Equal(testutil.ToFloat64(f.srv.metrics.signIns.WithLabelValues("rate_limited_global")), 1.0)
	f.now.advance(loginAttemptWindow)
	is.Equal(tryLogin(t, h, "alice", alicePassword, "203.0.113.9:4000").Code, http.StatusSeeOther)
}

// TestCSRFRefused: a resolve without the session's token, or with another session's, is 403 and
// changes nothing; with it the task resolves.
func TestCSRFRefused(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	id := f.parkedTask("push", "u1", "hello")
	ts := f.serve()
	alice, bob := f.client(ts), f.client(ts)
	aliceToken, bobToken := alice.signIn("alice", alicePassword), bob.signIn("bob", bobPassword)
	path := "/task/" + strconv.FormatInt(id, 10) + "/resolve"
	for _, token := range []string{"", "x", bobToken} {
		p := alice.post(path, url.Values{"csrf": {token}, "state": {"SENT"}, "note": {"seen in the console"}})
		is.Equal(p.code, http.StatusForbidden)
		is.True(strings.Contains(p.body, "did not carry this session"))
	}
	is.Equal(f.task(id), taskRow{state: "UNKNOWN", needsReview: true})               // nothing changed
	is.Equal(testutil.ToFloat64(f.srv.metrics.refused.WithLabelValues("csrf")), 3.0) // each refusal counted
	p := alice.post("/logout", url.Values{})
	is.Equal(p.code, http.StatusForbidden) // sign-out is a change too
	p = alice.post(path, url.Values{"csrf": {aliceToken}, "state": {"SENT"}, "note": {"seen in the console"}})
	is.Equal(p.code, http.StatusSeeOther)
	is.Equal(f.task(id).state, "SENT")
	// GET never changes anything: the resolve path does not answer it.
	is.Equal(alice.get(path).code, http.StatusNotFound)
}

// TestRequestSizeLimited: a form over MaxFormBytes is refused with 413 and changes nothing.
func TestRequestSizeLimited(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	id := f.parkedTask("push", "u1", "hello")
	c := f.client(f.serve())
	token := c.signIn("alice", alicePassword)
	p := c.post("/task/"+strconv.FormatInt(id, 10)+"/resolve",
		url.Values{"csrf": {token}, "state": {"SENT"}, "note": {strings.Repeat("n", MaxFormBytes)}})
	is.Equal(p.code, http.StatusRequestEntityTooLarge)
	is.Equal(f.task(id).state, "UNKNOWN")
	p = c.post("/login", url.Values{"csrf": {token}, "user": {strings.Repeat("u", MaxFormBytes)}})
	is.Equal(p.code, http.StatusRequestEntityTooLarge)
}

// TestResolveRecordsTheOperator: the signed-in user's name is on the MANUAL attempt with the note, one
// audit line says who resolved what; a second resolve (by bob) says "already resolved by alice at ..."
// and changes nothing; a note is required.
func TestResolveRecordsTheOperator(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	id := f.parkedTask("sms", "u1", "your code is 1234")
	ts := f.serve()
	alice, bob := f.client(ts), f.client(ts)
	aliceToken, bobToken := alice.signIn("alice", alicePassword), bob.signIn("bob", bobPassword)
	path := "/task/" + strconv.FormatInt(id, 10) + "/resolve"

	p := alice.post(path, url.Values{"csrf": {aliceToken}, "state": {"SENT"}, "note": {"   "}})
	is.Equal(p.code, http.StatusBadRequest)
	is.True(strings.Contains(p.body, "A note is required"))
	p = alice.post(path, url.Values{"csrf": {aliceToken}, "state": {"MAYBE"}, "note": {"n"}})
	is.Equal(p.code, http.StatusBadRequest)
	is.Equal(f.task(id).state, "UNKNOWN")

	p = alice.post(path, url.Values{"csrf": {aliceToken}, "state": {"SENT"}, "note": {"Twilio console: delivered <b>"}})
	is.Equal(p.code, http.StatusSeeOther)
	is.Equal(p.header.Get("Location"), "/?resolved="+strconv.FormatInt(id, 10)+"&as=SENT")
	is.Equal(f.task(id), taskRow{state: "SENT", manual: 1, operator: "alice", note: "Twilio console: delivered <b>"})
	audit := f.log.lines("msg=resolved")
	is.Equal(len(audit), 1)
	is.True(strings.Contains(audit[0], "task="+strconv.FormatInt(id, 10)+" state=SENT operator=alice via=console"))

	p = bob.post(path, url.Values{"csrf": {bobToken}, "state": {"FAILED"}, "note": {"not in the console"}})
	is.Equal(p.code, http.StatusConflict)
	is.True(strings.Contains(p.body, "already resolved by alice at "))
	is.Equal(f.task(id), taskRow{state: "SENT", manual: 1, operator: "alice", note: "Twilio console: delivered <b>"}) // unchanged
	is.Equal(len(f.log.lines("resolve changed nothing")), 1)
	is.Equal(len(f.log.lines("msg=resolved")), 1)

	// The task page shows the resolution and the note escaped, and no resolve form any more.
	page := alice.get("/task/" + strconv.FormatInt(id, 10))
	is.Equal(page.code, http.StatusOK)
	is.True(strings.Contains(page.body, "resolved by alice at "))
	is.True(strings.Contains(page.body, "delivered &lt;b&gt;"))
	is.True(!strings.Contains(page.body, `id="resolve"`))
}

// TestListFiltersAndPages: the list narrows by channel and state in the query and pages by the last id.
func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, func(c *Config) { c.PageSize = 2 })
	push1, sms1, push2, push3 := f.parkedTask("push", "u1", "a"), f.parkedTask("sms", "u2", "b"),
		f.parkedTask("push", "u3", "c"), f.parkedTask("push", "u4", "d")
	c := f.client(f.serve())
	c.signIn("alice", alicePassword)
	row := func(id int64) string { return `id="task-` + strconv.FormatInt(id, 10) + `"` }

	p := c.get("/?channel=push")
	is.True(strings.Contains(p.body, row(push1)) && strings.Contains(p.body, row(push2)))
	is.True(!strings.Contains(p.body, row(sms1)) && !strings.Contains(p.body, row(push3)))
	is.True(strings.Contains(p.body, `href="/?after=`+strconv.FormatInt(push2, 10)+`&amp;channel=push"`)) // a full page: a next one
	p = c.get("/?channel=push&after=" + strconv.FormatInt(push2, 10))
	is.True(strings.Contains(p.body, row(push3)))
	is.True(!strings.Contains(p.body, row(push1)))

	p = c.get("/?state=FAILED")
	is.True(strings.Contains(p.body, `id="empty"`)) // parked tasks are UNKNOWN
	p = c.get("/?state=UNKNOWN&channel=sms")
	is.True(strings.Contains(p.body, row(sms1)))
	is.Equal(c.get("/?state=SENT").code, http.StatusBadRequest) // never listed
	is.Equal(c.get("/?after=x").code, http.StatusBadRequest)
}

// TestStatusPage: counts by channel and state, the parked count and the rate limits.
func TestStatusPage(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	f.parkedTask("push", "u1", "a")
	f.parkedTask("push", "u2", "b")
	c := f.client(f.serve())
	c.signIn("alice", alicePassword)
	p := c.get("/status")
	is.Equal(p.code, http.StatusOK)
	is.True(strings.Contains(p.body, `<dd id="parked">2</dd>`))
	is.True(strings.Contains(p.body, "<td>push</td><td>UNKNOWN (parked)</td><td>2</td>"))
	is.True(strings.Contains(p.body, "No channel is rate-limited."))
}

// TestPausedChannelsShown: a channel the worker's query paused for an account state (ChannelPauseRefused,
// as a finish writes it) is shown above the tasks on the first page and on the status page, with its
// cause escaped (it is the provider's text), the wait between probes and the next probe; once a probe
// ends the pause, neither page shows it.
func TestPausedChannelsShown(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	ctx := context.Background()
	q := dbgen.New(f.owner)
	const cause = `401 <script>alert("x")</script> Authenticate`
	row, err := q.ChannelPauseRefused(ctx, dbgen.ChannelPauseRefusedParams{Channel: "sms", Cause: cause,
		StartSeconds: 120, HoldSeconds: 30, CapSeconds: 300})
	is.NoErr(err)
	is.True(row.Began) // the refusal paused sms
	f.parkedTask("push", "u1", "a")
	c := f.client(f.serve())
	c.signIn("alice", alicePassword)
	for _, path := range []string{"/", "/status"} {
		p := c.get(path)
		is.Equal(p.code, http.StatusOK)
		is.True(strings.Contains(p.body, `id="channel-pauses"`))                                                                       // the paused channels
		is.True(strings.Contains(p.body, `<tr id="paused-sms"><td>sms</td>`))                                                          // sms among them
		is.True(strings.Contains(p.body, `<pre class="cause">401 &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; Authenticate</pre>`)) // its cause, escaped
		is.True(!strings.Contains(p.body, "<script>"))                                                                                 // never markup
		is.True(strings.Contains(p.body, " ago)</td><td>2m0s</td><td>in "))                                                            // since when, the backoff, the next probe
	}
	p := c.get("/")
	is.True(strings.Index(p.body, `id="channel-pauses"`) < strings.Index(p.body, `id="tasks"`)) // above the tasks

	ended, err := q.ChannelPauseEnd(ctx, "sms")
	is.NoErr(err)
	is.Equal(len(ended), 1) // a probe ended the pause
	for _, path := range []string{"/", "/status"} {
		p := c.get(path)
		is.Equal(p.code, http.StatusOK)
		is.True(!strings.Contains(p.body, `id="channel-pauses"`)) // nothing paused, nothing shown
	}
}

// TestTrustedProxyHeader: with --trust-header the header names the operator only on requests from a
// trusted proxy; from elsewhere, or without the header, 403. The proxy's user is on the MANUAL attempt.
func TestTrustedProxyHeader(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, func(c *Config) {
		c.Users, c.TrustHeader = nil, "X-Forwarded-User"
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	})
	id := f.parkedTask("push", "u1", "hello")
	h := f.srv.Handler()
	do := func(method, path, addr, user string, form url.Values, cookies []*http.Cookie) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		if method == "POST" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		req.RemoteAddr = addr
		if user != "" {
			req.Header.Set("X-Forwarded-User", user)
		}
		for _, c := range cookies {
			req.AddCookie(c)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	is.Equal(do("GET", "/", "192.0.2.9:4000", "carol", nil, nil).Code, http.StatusForbidden) // not the proxy
	is.Equal(do("GET", "/", "10.1.2.3:4000", "", nil, nil).Code, http.StatusForbidden)       // the proxy, no user
	is.Equal(do("GET", "/login", "10.1.2.3:4000", "carol", nil, nil).Code, http.StatusSeeOther)
	rec := do("GET", "/task/"+strconv.FormatInt(id, 10), "10.1.2.3:4000", "carol", nil, nil)
	is.Equal(rec.Code, http.StatusOK)
	is.True(strings.Contains(rec.Body.String(), `<strong id="operator">carol</strong>`))
	token := csrfField.FindStringSubmatch(rec.Body.String())[1]
	cookies := rec.Result().Cookies()
	form := url.Values{"csrf": {token}, "state": {"FAILED"}, "note": {"bounced per provider"}}
	path := "/task/" + strconv.FormatInt(id, 10) + "/resolve"
	is.Equal(do("POST", path, "192.0.2.9:4000", "carol", form, cookies).Code, http.StatusForbidden) // the cookie alone is not enough
	is.Equal(do("POST", path, "10.1.2.3:4000", "dave", form, cookies).Code, http.StatusForbidden)   // another user: carol's token is not his
	is.Equal(f.task(id).state, "UNKNOWN")
	is.Equal(do("POST", path, "10.1.2.3:4000", "carol", form, cookies).Code, http.StatusSeeOther)
	is.Equal(f.task(id), taskRow{state: "FAILED", manual: 1, operator: "carol", note: "bounced per provider"})
}

// TestNewRefusesHalfConfigs: a console needs exactly one way to sign in, and a trusted header needs proxies.
func TestNewRefusesHalfConfigs(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	f := newFixture(t, nil)
	base := f.srv.cfg
	for _, change := range []func(*Config){
		func(c *Config) { c.Users = nil },
		func(c *Config) { c.TrustHeader = "X-Forwarded-User" },
		func(c *Config) { c.Users, c.TrustHeader = nil, "X-Forwarded-User" },
	} {
		cfg := base
		change(&cfg)
		_, err := New(cfg)
		is.True(err != nil)
	}
}

// TestParseUsers: htpasswd -B lines are read; other hashes, duplicates and malformed lines are refused,
// naming the line but never the hash.
func TestParseUsers(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := string(mustHash(t, "pw"))
	users, err := ParseUsers(strings.NewReader("# operators\n\nalice:" + h + "\nbob:" + h + "\n"))
	is.NoErr(err)
	is.Equal(len(users), 2)
	is.True(users.check(bcrypt.CompareHashAndPassword, "alice", "pw"))
	is.True(!users.check(bcrypt.CompareHashAndPassword, "alice", "PW"))
	var compared []string
	anything := func(hash, _ []byte) error { compared = append(compared, string(hash)); return nil }
	is.True(!users.check(anything, "carol", "pw")) // an unknown user is refused, whatever the comparison says
	is.Equal(compared, []string{h})                // after one bcrypt run against a listed user's hash
	for _, bad := range []string{
		"alice:$apr1$abc$def\n", // htpasswd's MD5
		"alice:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n",
		"alice\n",
		"alice:" + h + "\nalice:" + h + "\n",
		"al ice:" + h + "\n",
		"",
	} {
		_, err := ParseUsers(strings.NewReader(bad))
		is.True(err != nil)
		is.True(!strings.Contains(err.Error(), "$apr1$") && !strings.Contains(err.Error(), h))
	}
	hash, err := hashPassword("s3cret", bcrypt.MinCost)
	is.NoErr(err)
	users, err = ParseUsers(strings.NewReader("ops:" + hash))
	is.NoErr(err)
	is.True(users.check(bcrypt.CompareHashAndPassword, "ops", "s3cret"))
}

// TestHashPasswordRefusesWhatBcryptWouldNotKeep: an empty password, and one whose bytes past 72 bcrypt
// would silently ignore, get an error, never a hash.
func TestHashPasswordRefusesWhatBcryptWouldNotKeep(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	for _, pw := range []string{"", strings.Repeat("a", 73)} {
		hash, err := HashPassword(pw)
		is.True(err != nil)
		is.Equal(hash, "")
	}
	_, err := hashPassword(strings.Repeat("a", 72), bcrypt.MinCost)
	is.NoErr(err) // 72 bytes are all kept
}
