// Package console is notifier console: a small server-rendered web page where operators list the tasks a
// human must look at (notifier review), settle parked ones (notifier resolve, through notifier_resolve())
// and read notifier status. It runs with the operator role and reads and writes only through the service
// layer's calls that those commands use.
//
// Security (docs/operations.md#web-console): operators only, by bcrypt users (Users) or an authenticating
// proxy's header trusted from given addresses only; sessions in memory behind an HttpOnly, SameSite=Strict
// (and, unless served as plain HTTP on purpose, Secure) cookie; a CSRF token on every form that changes
// something, and POST only for changes; a strict Content-Security-Policy with no script at all; every
// body and note escaped by html/template; request bodies limited; login attempts limited per user and
// address; one audit log line per resolve.
package console

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/notifierhq/notifier/service"
)

// ContentSecurityPolicy allows the console's own stylesheet and images and nothing else: no script of any
// kind, no frames, forms posting only to the console.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// MaxFormBytes bounds a request body: a resolve's note is at most service.MaxNoteLength characters.
const MaxFormBytes = 64 << 10

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config is what a console serves with.
type Config struct {
	Notifier *service.Notifier
	Log      *slog.Logger
	// Users signs operators in with a password (--users-file). Exactly one of Users and TrustHeader.
	Users Users
	// TrustHeader names the header an authenticating proxy sets to the signed-in user
	// (--trust-header X-Forwarded-User), believed only from TrustedProxies.
	TrustHeader    string
	TrustedProxies []netip.Prefix
	// SecureCookie sets the Secure attribute (and the __Host- prefix) on the console's cookies. Off only
	// when the console serves plain HTTP to browsers on purpose (--insecure-listen).
	SecureCookie bool
	SessionTTL   time.Duration // a session ends this long after sign-in (default 8h)
	DBTimeout    time.Duration // bound on each page's database calls (default 10s)
	PageSize     int           // tasks per list page (default 50, as notifier review)
	Now          func() time.Time
}

// Server is a console's HTTP handler and its state (sessions, login failures).
type Server struct {
	cfg      Config
	pages    map[string]*template.Template
	sessions *sessions
	limiter  *loginLimiter
	attempts *attemptLimiter
	compare  compareFunc // bcrypt.CompareHashAndPassword; tests count its runs
	metrics  *metrics
	handler  http.Handler
}

// New checks cfg and builds the console.
func New(cfg Config) (*Server, error) {
	if cfg.Notifier == nil || cfg.Log == nil {
		return nil, errors.New("console: a notifier and a logger are required")
	}
	if (cfg.Users == nil) == (cfg.TrustHeader == "") {
		return nil, errors.New("console: exactly one of users and a trusted header")
	}
	if cfg.TrustHeader != "" && len(cfg.TrustedProxies) == 0 {
		return nil, errors.New("console: a trusted header needs the proxies' addresses")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.DBTimeout <= 0 {
		cfg.DBTimeout = 10 * time.Second
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pages: pages, sessions: newSessions(cfg.SessionTTL, cfg.Now), limiter: newLoginLimiter(cfg.Now),
		attempts: newAttemptLimiter(cfg.Now), compare: bcrypt.CompareHashAndPassword, metrics: newMetrics()}
	static, _ := fs.Sub(staticFS, "static")
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.signedIn(s.logout))
	mux.HandleFunc("GET /{$}", s.signedIn(s.list))
	mux.HandleFunc("GET /task/{id}", s.signedIn(s.task))
	mux.HandleFunc("POST /task/{id}/resolve", s.signedIn(s.resolve))
	mux.HandleFunc("GET /status", s.signedIn(s.status))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, nil, http.StatusNotFound, "No such page.")
	})
	// Cross-origin POSTs (by Sec-Fetch-Site or Origin) are refused before any handler: a second line behind
	// the CSRF token and the SameSite cookie.
	s.handler = secureHeaders(limitBodies(http.NewCrossOriginProtection().Handler(mux)))
	return s, nil
}

// Handler serves the console.
func (s *Server) Handler() http.Handler { return s.handler }

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{"clock": clock, "age": age, "latency": latency, "excerpt": excerpt, "seconds": seconds}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "list", "task", "status", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// secureHeaders sets the headers every answer carries: the CSP, no sniffing, no framing, no referrer
// (a task's URL names it), and no caching of pages that show users' messages.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// limitBodies bounds every request body: a form larger than MaxFormBytes fails to parse (413).
func limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
		next.ServeHTTP(w, r)
	})
}
