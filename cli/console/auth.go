package console

import (
	"bufio"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// Users are the console's accounts: name to bcrypt hash, read from an htpasswd-style file.
type Users map[string][]byte

// ParseUsers reads "name:$2y$..." lines (htpasswd -B's format; bcrypt only: htpasswd's MD5, SHA1 and
// crypt hashes are refused, they are cheap to guess). Blank lines and lines starting with # are skipped.
// Errors name the line, never its hash.
func ParseUsers(r io.Reader) (Users, error) {
	users := Users{}
	sc := bufio.NewScanner(r)
	for no := 1; sc.Scan(); no++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("line %d: want name:bcrypt-hash", no)
		case !validUserName(name):
			return nil, fmt.Errorf("line %d: user name %q: want 1-64 printable characters without spaces or colons", no, name)
		case users[name] != nil:
			return nil, fmt.Errorf("line %d: user %q is listed twice", no, name)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("line %d: user %q: not a bcrypt hash (create it with htpasswd -B or notifier console --hash-password)", no, name)
		}
		users[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, errors.New("no users in it")
	}
	return users, nil
}

func validUserName(name string) bool {
	if name == "" || utf8.RuneCountInString(name) > 64 || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r <= ' ' || r == ':' || r == 0x7f {
			return false
		}
	}
	return true
}

// HashCost is the bcrypt cost of --hash-password (htpasswd -B uses 5 by default; 12 costs an attacker
// who has the file 128 times more per guess and a login about a quarter of a second).
const HashCost = 12

// HashPassword is the users-file line's hash of password, at HashCost.
func HashPassword(password string) (string, error) { return hashPassword(password, HashCost) }

// hashPassword is HashPassword at any cost: its tests run at bcrypt's lowest, where a run at HashCost
// takes seconds under -race. cli's TestConsoleServesOverTLS checks a --hash-password line at HashCost.
func hashPassword(password string, cost int) (string, error) {
	if password == "" {
		return "", errors.New("empty password")
	}
	if len(password) > 72 {
		return "", errors.New("password longer than 72 bytes: bcrypt ignores the rest")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	return string(h), err
}

// compareFunc is bcrypt.CompareHashAndPassword, or a test's counter around it.
type compareFunc func(hash, password []byte) error

// check reports whether name's password is password, comparing with compare (one bcrypt run).
//
// An unknown name is compared against a listed user's hash and refused whatever the answer, so that
// it takes as long as a wrong password (no user enumeration by timing). A listed hash has the cost
// the file's users have: a fixed dummy at HashCost would make unknown names slower than known ones in
// a file of htpasswd -B's cost 5 hashes, and cost a bcrypt run to make.
func (u Users) check(compare compareFunc, name, password string) bool {
	if hash, ok := u[name]; ok {
		return compare(hash, []byte(password)) == nil
	}
	for _, listed := range u {
		_ = compare(listed, []byte(password))
		break
	}
	return false
}

// session is a signed-in operator: the cookie holds its id, the server everything else.
type session struct {
	id      string
	user    string
	csrf    string
	expires time.Time
}

// sessions are kept in memory: a restart signs everyone out, which is what an operator expects of a
// console they reach again in a second.
type sessions struct {
	mu  sync.Mutex
	m   map[string]*session
	ttl time.Duration
	now func() time.Time
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{m: map[string]*session{}, ttl: ttl, now: now}
}

// start opens a session for user, dropping the expired ones.
func (s *sessions) start(user string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for id, old := range s.m {
		if !now.Before(old.expires) {
			delete(s.m, id)
		}
	}
	sess := &session{id: randomToken(), user: user, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.m[sess.id] = sess
	return sess
}

// get is the live session with id, or nil.
func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.m[id]
	if sess == nil {
		return nil
	}
	if !s.now().Before(sess.expires) {
		delete(s.m, id)
		return nil
	}
	return sess
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// randomToken is 256 random bits, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than returning an error)
	return base64.RawURLEncoding.EncodeToString(b)
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Login rate limit: after loginFailures wrong passwords for one user from one address within
// loginWindow, that pair may not try again until the window has passed. Another address, or another
// user name, has its own count: an attacker cannot lock an operator out from elsewhere.
const (
	loginFailures = 5
	loginWindow   = 15 * time.Minute
)

type loginLimiter struct {
	mu  sync.Mutex
	m   map[string]*failures
	now func() time.Time
}

type failures struct {
	count int
	since time.Time
}

func newLoginLimiter(now func() time.Time) *loginLimiter {
	return &loginLimiter{m: map[string]*failures{}, now: now}
}

// wait is how long key must wait before its next attempt (0: it may try now).
func (l *loginLimiter) wait(key string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.m[key]
	if f == nil {
		return 0
	}
	left := f.since.Add(loginWindow).Sub(l.now())
	if left <= 0 {
		delete(l.m, key)
		return 0
	}
	if f.count < loginFailures {
		return 0
	}
	return left
}

// failed counts a wrong password of key, dropping the counts whose window has passed.
func (l *loginLimiter) failed(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for k, f := range l.m {
		if !now.Before(f.since.Add(loginWindow)) {
			delete(l.m, k)
		}
	}
	if f := l.m[key]; f != nil {
		f.count++
		return
	}
	l.m[key] = &failures{count: 1, since: now}
}

func (l *loginLimiter) succeeded(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

// Sign-in attempt limits, checked before bcrypt runs (each check costs about a quarter of a second of
// a core at HashCost): at most loginAttemptsPerAddress attempts from one source address, and
// loginAttemptsGlobal from all addresses together, within each loginAttemptWindow, right or wrong
// passwords alike. An attempt past either limit is answered 429 with Retry-After and runs no bcrypt,
// so sign-in costs at most loginAttemptsGlobal bcrypt runs a minute (about a quarter of one core)
// however many addresses an attacker has. The price: while the global limit is reached, operators
// cannot sign in either (sessions already open are unaffected) until the window ends.
const (
	loginAttemptsPerAddress = 20
	loginAttemptsGlobal     = 60
	loginAttemptWindow      = time.Minute
)

// attemptLimiter counts sign-in attempts per source address and in all, in fixed windows.
type attemptLimiter struct {
	mu       sync.Mutex
	now      func() time.Time
	perAddr  map[netip.Addr]*failures // count: attempts admitted in the window since since
	global   failures
	addrMax  int
	totalMax int
	window   time.Duration
}

func newAttemptLimiter(now func() time.Time) *attemptLimiter {
	return &attemptLimiter{now: now, perAddr: map[netip.Addr]*failures{},
		addrMax: loginAttemptsPerAddress, totalMax: loginAttemptsGlobal, window: loginAttemptWindow}
}

// admit counts an attempt from addr and returns 0, or, when addr or everyone has used up the window's
// attempts, how long until the next may be made (the attempt is then not counted). The per-address map
// only holds addresses admitted in the current window, so it is bounded by the global limit.
func (l *attemptLimiter) admit(addr netip.Addr) (wait time.Duration, scope string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !now.Before(l.global.since.Add(l.window)) {
		l.global = failures{since: now}
	}
	for a, f := range l.perAddr {
		if !now.Before(f.since.Add(l.window)) {
			delete(l.perAddr, a)
		}
	}
	f := l.perAddr[addr]
	switch {
	case f != nil && f.count >= l.addrMax:
		return f.since.Add(l.window).Sub(now), "address"
	case l.global.count >= l.totalMax:
		return l.global.since.Add(l.window).Sub(now), "global"
	case f == nil:
		l.perAddr[addr] = &failures{count: 1, since: now}
	default:
		f.count++
	}
	l.global.count++
	return 0, ""
}

// retryAfter is wait as Retry-After's whole seconds, rounded up.
func retryAfter(wait time.Duration) string {
	return strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10)
}

// remoteIP is the request's peer address: the proxy's, when there is one (a header naming the client is
// only believed from a trusted proxy, and the console reads no such header).
func remoteIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

// ParseCIDRs reads --trusted-proxy values: CIDRs, or single addresses.
func ParseCIDRs(values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		v = strings.TrimSpace(v)
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("%q: want a CIDR such as 10.0.0.0/8 or an address", v)
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}
