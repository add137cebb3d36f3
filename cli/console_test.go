package cli

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"
	"golang.org/x/crypto/bcrypt"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
)

// consoleUsers writes a users file with alice's hash at bcrypt's lowest cost: for tests that need a valid
// file, not the cost. A hash at HashCost takes seconds under -race (11 s each on a loaded machine);
// hashedConsoleUsers makes one the way an operator does, where that is what the test shows.
func consoleUsers(t *testing.T, password string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	is.New(t).NoErr(err)
	return writeConsoleUsers(t, string(hash))
}

func writeConsoleUsers(t *testing.T, hash string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "users")
	is.New(t).NoErr(os.WriteFile(file, []byte("# console operators\nalice:"+hash+"\n"), 0o600))
	return file
}

// hashedConsoleUsers writes a users file with alice's hash made by notifier console --hash-password.
func hashedConsoleUsers(t *testing.T, c notifierCLI, password string) string {
	t.Helper()
	is := is.New(t)
	r := c.run(password+"\n", "console", "--hash-password")
	is.Equal(r.code, 0)
	hash := strings.TrimSpace(r.stdout)
	is.NoErr(bcrypt.CompareHashAndPassword([]byte(hash), []byte(password))) // the hash of what stdin held
	cost, err := bcrypt.Cost([]byte(hash))
	is.NoErr(err)
	is.Equal(cost, 12)
	return writeConsoleUsers(t, hash)
}

// TestConsoleRefusesBadCommandLines: every half or unsafe configuration exits 2 with one clear line,
// before touching the database (none is given).
func TestConsoleRefusesBadCommandLines(t *testing.T) {
	t.Parallel()
	c := notifierCLI{t: t}
	users := consoleUsers(t, "pw-of-alice")
	badUsers := filepath.Join(t.TempDir(), "bad-users")
	is.New(t).NoErr(os.WriteFile(badUsers, []byte("alice:$apr1$secrethash$x\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:8080", "--users-file", users}, "refusing to serve plain HTTP on 0.0.0.0:8080, which is not a loopback address"},
		{[]string{"--listen", ":8080", "--users-file", users}, "refusing to serve plain HTTP on :8080"},
		{[]string{"--listen", "192.0.2.1:8080", "--trust-header", "X-Forwarded-User", "--trusted-proxy", "192.0.2.0/24"}, "refusing to serve plain HTTP"},
		{[]string{}, "give --users-file FILE or --trust-header NAME"},
		{[]string{"--users-file", users, "--trust-header", "X-Forwarded-User"}, "not both"},
		{[]string{"--trust-header", "X-Forwarded-User"}, "--trust-header needs --trusted-proxy"},
		{[]string{"--users-file", users, "--trusted-proxy", "10.0.0.0/8"}, "--trusted-proxy goes with --trust-header"},
		{[]string{"--trust-header", "X-Forwarded-User", "--trusted-proxy", "10.0.0/8"}, "invalid --trusted-proxy"},
		{[]string{"--trust-header", "X Forwarded", "--trusted-proxy", "10.0.0.0/8"}, "invalid --trust-header"},
		{[]string{"--users-file", users, "--tls-cert", "cert.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--users-file", users, "--tls-cert", "nope.pem", "--tls-key", "nope.key"}, "invalid --tls-cert/--tls-key"},
		{[]string{"--users-file", filepath.Join(t.TempDir(), "missing")}, "invalid --users-file"},
		{[]string{"--users-file", badUsers}, "line 1: user \"alice\": not a bcrypt hash"},
		{[]string{"--users-file", users, "--listen", "localhost"}, "invalid --listen"},
		{[]string{"--users-file", users, "--session-ttl", "0s"}, "invalid --session-ttl"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			is := is.New(t)
			r := c.in(t).run("", append([]string{"console"}, tc.args...)...)
			is.Equal(r.code, 2)
			oneErrorLine(t, r)
			is.True(strings.Contains(r.stderr, tc.want))
			is.True(!strings.Contains(r.stderr, "secrethash")) // a hash is never printed
			is.Equal(r.stdout, "")
		})
	}
	t.Run("hash-password without a password", func(t *testing.T) {
		is := is.New(t)
		r := c.in(t).run("", "console", "--hash-password")
		is.Equal(r.code, 2)
		is.True(strings.Contains(r.stderr, "no password on stdin"))
	})
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns their paths.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	is := is.New(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	is.NoErr(err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "console test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	is.NoErr(err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	is.NoErr(err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	is.NoErr(os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	is.NoErr(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

// consoleURL waits for the "serving console" log line (--log-format json) and returns its URL.
func consoleURL(t *testing.T, p *process) string {
	t.Helper()
	var u string
	testworld.Eventually(t, 20*time.Second, "the console's URL in the log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var line struct {
				Msg string `json:"msg"`
				URL string `json:"url"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving console" {
				u = line.URL
				return true
			}
		}
		return false
	})
	return strings.TrimSuffix(u, "/")
}

// TestConsoleServesOverTLS: notifier console, run as a login of the operator role with --tls-cert and a
// users file made with --hash-password, serves HTTPS (on a non-loopback-capable setup: TLS lifts the
// loopback rule), signs alice in with a Secure cookie, resolves a parked task under her name and logs
// one audit line; SIGTERM stops it with exit 0. A user without the operator role is refused at start.
func TestConsoleServesOverTLS(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	id := parkedTask(t, pool)
	users := hashedConsoleUsers(t, c, "pw-of-alice")
	cert, key := selfSigned(t)
	args := []string{"--log-format", "json", "console", "--listen", "127.0.0.1:0", "--users-file", users,
		"--tls-cert", cert, "--tls-key", key, "--metrics-addr", "127.0.0.1:0"}

	r := c.loginAs(pool, service.RoleWorker).run("", args...)
	is.Equal(r.code, 1) // the wrong role: refused at start, not at the first resolve
	is.True(strings.Contains(r.stderr, "console needs the notifier_operator role"))

	p := c.loginAs(pool, service.RoleOperator).start(args...)
	base := consoleURL(t, p)
	is.True(strings.HasPrefix(base, "https://127.0.0.1:"))
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // the test's own certificate
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	read := func(resp *http.Response, err error) (*http.Response, string) {
		t.Helper()
		is.NoErr(err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		is.NoErr(err)
		return resp, string(b)
	}
	token := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	resp, body := read(client.Get(base + "/login"))
	is.Equal(resp.StatusCode, 200)
	is.True(strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'"))
	resp, _ = read(client.PostForm(base+"/login", url.Values{"csrf": {token.FindStringSubmatch(body)[1]},
		"user": {"alice"}, "password": {"pw-of-alice"}}))
	is.Equal(resp.StatusCode, http.StatusSeeOther)
	setCookie := resp.Header.Get("Set-Cookie")
	is.True(strings.HasPrefix(setCookie, "__Host-notifier_console="))
	is.True(strings.Contains(setCookie, "; HttpOnly; Secure; SameSite=Strict"))
	resp, body = read(client.Get(base + "/task/" + strconv.FormatInt(id, 10)))
	is.Equal(resp.StatusCode, 200)
	resp, _ = read(client.PostForm(base+"/task/"+strconv.FormatInt(id, 10)+"/resolve", url.Values{
		"csrf": {token.FindStringSubmatch(body)[1]}, "state": {"FAILED"}, "note": {"provider says rejected"}}))
	is.Equal(resp.StatusCode, http.StatusSeeOther)
	var state, worker, note string
	is.NoErr(pool.QueryRow(context.Background(), `SELECT t.state, a.worker, a.note FROM delivery_task t
		JOIN delivery_attempt a ON a.task_id = t.id AND a.action = 'MANUAL' WHERE t.id = $1`, id).Scan(&state, &worker, &note))
	is.Equal([]string{state, worker, note}, []string{"FAILED", "alice", "provider says rejected"})

	metrics := scrape(t, "http://"+metricsAddr(t, p)+"/metrics")
	for _, want := range []string{
		`notifier_console_resolves_total{result="resolved",state="FAILED"} 1`,
		`notifier_console_resolves_total{result="unchanged",state="SENT"} 0`,
		`notifier_console_sign_ins_total{result="ok"} 1`,
		`notifier_console_refused_total{reason="csrf"} 0`,
	} {
		is.True(strings.Contains(metrics, want)) // the console's counters
	}

	is.Equal(p.stop(syscall.SIGTERM), 0)
	var audit []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "resolved" {
			audit = append(audit, line)
		}
	}
	is.Equal(len(audit), 1) // one audit line for the one resolve
	is.Equal(audit[0]["operator"], "alice")
	is.Equal(audit[0]["task"], float64(id))
	is.Equal(audit[0]["state"], "FAILED")
	is.True(!strings.Contains(p.stderr.String(), "pw-of-alice")) // the password is never logged
}
