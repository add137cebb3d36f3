package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// view is what a page's template reads; each page fills its part.
type view struct {
	Title  string
	User   string // signed-in operator; "" on the sign-in page
	CSRF   string // the session's (or, on the sign-in page, the sign-in cookie's) token for the forms
	Proxy  bool   // signed in by the proxy: no sign-out form
	Error  string
	Notice string
	Now    time.Time

	// list
	Items    []listItem
	Channel  string
	State    string
	States   []string
	NextPage string
	Paged    bool
	// and above it the channels paused for an account state: nothing on them is delivered
	ChannelPauses []service.ChannelPause

	// task
	Task *taskView

	// status
	Status *service.Status
}

type listItem struct {
	service.ReviewTask
	Body  string
	Since time.Time // the first attempt's start (the task's updated_at without one)
}

type taskView struct {
	service.Task
	Notification service.Notification
	Attempts     []service.AttemptRecord
	Parked       bool
	Resolution   string // who resolved it and when, once resolved
}

// listStates are the list's state filter's choices: what a listed task can be in.
var listStates = []string{string(delivery.StateUnknown), string(delivery.StateFailed), string(delivery.StateSuppressed)}

const (
	sessionCookie = "notifier_console"
	loginCookie   = "notifier_console_login" // the sign-in form's CSRF token, before there is a session
)

func (s *Server) cookieName(base string) string {
	if s.cfg.SecureCookie {
		return "__Host-" + base // only over HTTPS, for this host and path / only: no subdomain can set it
	}
	return base
}

func (s *Server) setCookie(w http.ResponseWriter, base, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{
		Name: s.cookieName(base), Value: value, Path: "/", MaxAge: int(maxAge.Seconds()),
		HttpOnly: true, Secure: s.cfg.SecureCookie, SameSite: http.SameSiteStrictMode,
	})
}

func (s *Server) clearCookie(w http.ResponseWriter, base string) {
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(base), Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: s.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
}

func (s *Server) cookie(r *http.Request, base string) string {
	c, err := r.Cookie(s.cookieName(base))
	if err != nil {
		return ""
	}
	return c.Value
}

// signedIn serves next to an operator only, and a POST only with the session's CSRF token.
func (s *Server) signedIn(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		if r.Method == http.MethodPost {
			if !s.parseForm(w, r, sess) {
				return
			}
			if !sameToken(r.PostFormValue("csrf"), sess.csrf) {
				s.metrics.refused.WithLabelValues("csrf").Inc()
				s.cfg.Log.Warn("console: form refused without its CSRF token", "path", r.URL.Path, "operator", sess.user, "remote", remoteIP(r))
				s.fail(w, r, sess, http.StatusForbidden, "This form is refused: it did not carry this session's token. Reload the page and try again.")
				return
			}
		}
		next(w, r, sess)
	}
}

// authenticate finds the operator: the session of the cookie (users) or the trusted proxy's header.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (*session, bool) {
	if s.cfg.TrustHeader == "" {
		sess := s.sessions.get(s.cookie(r, sessionCookie))
		if sess != nil {
			return sess, true
		}
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
		} else {
			s.fail(w, r, nil, http.StatusForbidden, "Sign in first.")
		}
		return nil, false
	}
	ip := remoteIP(r)
	trusted := false
	for _, p := range s.cfg.TrustedProxies {
		if ip.IsValid() && p.Contains(ip) {
			trusted = true
			break
		}
	}
	user := r.Header.Get(s.cfg.TrustHeader)
	if !trusted || !validUserName(user) {
		s.metrics.refused.WithLabelValues("untrusted_proxy").Inc()
		s.cfg.Log.Warn("console: request refused: not from a trusted proxy, or without its user header", "remote", ip, "trusted", trusted)
		s.fail(w, r, nil, http.StatusForbidden, "The console is reached through its authenticating proxy only.")
		return nil, false
	}
	// The session only carries the CSRF token; the proxy's header says who it is on every request.
	if sess := s.sessions.get(s.cookie(r, sessionCookie)); sess != nil && sess.user == user {
		return sess, true
	}
	sess := s.sessions.start(user)
	s.setCookie(w, sessionCookie, sess.id, s.cfg.SessionTTL)
	return sess, true
}

// parseForm reads a POST's form within MaxFormBytes; false when it answered already.
func (s *Server) parseForm(w http.ResponseWriter, r *http.Request, sess *session) bool {
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.metrics.refused.WithLabelValues("too_large").Inc()
			s.fail(w, r, sess, http.StatusRequestEntityTooLarge, fmt.Sprintf("The form is larger than %d KiB.", MaxFormBytes>>10))
		} else {
			s.fail(w, r, sess, http.StatusBadRequest, "The form could not be read.")
		}
		return false
	}
	return true
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.TrustHeader != "" {
		http.Redirect(w, r, "/", http.StatusSeeOther) // the proxy signs operators in
		return
	}
	if s.sessions.get(s.cookie(r, sessionCookie)) != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.renderLogin(w, r, http.StatusOK, "")
}

// renderLogin shows the sign-in form with a fresh token in a cookie of its own (double submit: there is
// no session yet to hold it, and a sign-in page served to anyone should not grow the server's memory).
func (s *Server) renderLogin(w http.ResponseWriter, r *http.Request, code int, msg string) {
	token := randomToken()
	s.setCookie(w, loginCookie, token, time.Hour)
	s.render(w, r, code, "login", view{Title: "Sign in", CSRF: token, Error: msg})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.TrustHeader != "" {
		s.fail(w, r, nil, http.StatusNotFound, "No such page.")
		return
	}
	if !s.parseForm(w, r, nil) {
		return
	}
	if !sameToken(r.PostFormValue("csrf"), s.cookie(r, loginCookie)) {
		s.fail(w, r, nil, http.StatusForbidden, "This form is refused: it did not carry its token. Reload the page and try again.")
		return
	}
	user, password, ip := r.PostFormValue("user"), r.PostFormValue("password"), remoteIP(r)
	key := user + "\x00" + ip.String()
	if wait := s.limiter.wait(key); wait > 0 {
		s.metrics.signIns.WithLabelValues("rate_limited").Inc()
		s.cfg.Log.Warn("console: sign-in refused: too many failures", "user", user, "remote", ip)
		w.Header().Set("Retry-After", retryAfter(wait))
		s.renderLogin(w, r, http.StatusTooManyRequests,
			fmt.Sprintf("Too many failed sign-ins for this user from your address: try again in %s.", wait.Round(time.Minute)+time.Minute))
		return
	}
	// Before bcrypt: an attempt over the per-address or the global limit costs no hashing.
	if wait, scope := s.attempts.admit(ip); wait > 0 {
		s.metrics.signIns.WithLabelValues("rate_limited_" + scope).Inc()
		s.cfg.Log.Warn("console: sign-in refused: too many attempts", "scope", scope, "user", user, "remote", ip)
		w.Header().Set("Retry-After", retryAfter(wait))
		s.renderLogin(w, r, http.StatusTooManyRequests, "Too many sign-in attempts: try again in "+retryAfter(wait)+" seconds.")
		return
	}
	if !s.cfg.Users.check(s.compare, user, password) {
		s.limiter.failed(key)
		s.metrics.signIns.WithLabelValues("wrong_password").Inc()
		s.cfg.Log.Warn("console: sign-in refused: wrong user name or password", "user", user, "remote", ip)
		s.renderLogin(w, r, http.StatusUnauthorized, "Wrong user name or password.")
		return
	}
	s.limiter.succeeded(key)
	s.metrics.signIns.WithLabelValues("ok").Inc()
	sess := s.sessions.start(user) // a new id at sign-in: a planted cookie cannot become a session
	s.setCookie(w, sessionCookie, sess.id, s.cfg.SessionTTL)
	s.clearCookie(w, loginCookie)
	s.cfg.Log.Info("console: signed in", "operator", user, "remote", ip)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	s.sessions.end(sess.id)
	s.clearCookie(w, sessionCookie)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (s *Server) dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.DBTimeout)
}

// list is notifier review as a page: parked tasks and final ones a late answer contradicts, filtered by
// channel and state, paged by the last id shown.
func (s *Server) list(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	v := s.viewFor(sess, "Tasks to look at")
	v.States = listStates
	v.Channel = strings.TrimSpace(q.Get("channel"))
	v.State = strings.ToUpper(strings.TrimSpace(q.Get("state")))
	var after int64
	if a := q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			s.fail(w, r, sess, http.StatusBadRequest, "Bad page: after must be a task id.")
			return
		}
		after, v.Paged = n, true
	}
	if id, err := strconv.ParseInt(q.Get("resolved"), 10, 64); err == nil && id > 0 {
		if st := q.Get("as"); st == string(delivery.StateSent) || st == string(delivery.StateFailed) {
			v.Notice = fmt.Sprintf("Task %d resolved as %s.", id, st)
		}
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	// The first page an operator sees says first that a channel delivers nothing, and why.
	pauses, err := s.cfg.Notifier.ChannelPauses(ctx)
	if err != nil {
		s.dbFailed(w, r, sess, "read channel pauses", err)
		return
	}
	v.ChannelPauses = pauses
	tasks, err := s.cfg.Notifier.ReviewWhere(ctx, service.ReviewFilter{AfterID: after, Limit: s.cfg.PageSize,
		Channel: v.Channel, State: delivery.State(v.State)})
	if errors.Is(err, delivery.ErrInvalidInput) {
		s.fail(w, r, sess, http.StatusBadRequest, "Bad filter: "+err.Error())
		return
	}
	if err != nil {
		s.dbFailed(w, r, sess, "list tasks", err)
		return
	}
	ids := make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i] = t.NotificationID
	}
	bodies, err := s.cfg.Notifier.Bodies(ctx, ids)
	if err != nil {
		s.dbFailed(w, r, sess, "read bodies", err)
		return
	}
	for _, t := range tasks {
		since := t.UpdatedAt
		if len(t.Attempts) > 0 {
			since = t.Attempts[0].StartedAt
		}
		v.Items = append(v.Items, listItem{ReviewTask: t, Body: bodies[t.NotificationID], Since: since})
	}
	if len(tasks) == s.cfg.PageSize {
		next := url.Values{"after": {strconv.FormatInt(tasks[len(tasks)-1].ID, 10)}}
		if v.Channel != "" {
			next.Set("channel", v.Channel)
		}
		if v.State != "" {
			next.Set("state", v.State)
		}
		v.NextPage = "/?" + next.Encode()
	}
	s.render(w, r, http.StatusOK, "list", v)
}

func (s *Server) viewFor(sess *session, title string) view {
	return view{Title: title, User: sess.user, CSRF: sess.csrf, Proxy: s.cfg.TrustHeader != "", Now: s.cfg.Now()}
}

func taskID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id, err == nil && id > 0
}

func (s *Server) task(w http.ResponseWriter, r *http.Request, sess *session) {
	id, ok := taskID(r)
	if !ok {
		s.fail(w, r, sess, http.StatusNotFound, "No such task.")
		return
	}
	s.renderTask(w, r, sess, id, http.StatusOK, "")
}

// renderTask shows a task with its notification and attempts, and the resolve forms while it is parked.
func (s *Server) renderTask(w http.ResponseWriter, r *http.Request, sess *session, id int64, code int, msg string) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	task, err := s.cfg.Notifier.Task(ctx, id)
	if errors.Is(err, delivery.ErrNotFound) {
		s.fail(w, r, sess, http.StatusNotFound, fmt.Sprintf("No task %d.", id))
		return
	}
	if err != nil {
		s.dbFailed(w, r, sess, "read task", err)
		return
	}
	attempts, err := s.cfg.Notifier.Attempts(ctx, id)
	if err != nil {
		s.dbFailed(w, r, sess, "read attempts", err)
		return
	}
	ntf, err := s.cfg.Notifier.Notification(ctx, task.NotificationID)
	if err != nil {
		s.dbFailed(w, r, sess, "read notification", err)
		return
	}
	v := s.viewFor(sess, fmt.Sprintf("Task %d", id))
	v.Error = msg
	v.Task = &taskView{Task: task, Notification: ntf, Attempts: attempts,
		Parked: task.State == delivery.StateUnknown && task.NeedsReview, Resolution: resolution(attempts)}
	s.render(w, r, code, "task", v)
}

// resolution says who resolved a task and when, from its MANUAL attempt; "" when none did.
func resolution(attempts []service.AttemptRecord) string {
	for i := len(attempts) - 1; i >= 0; i-- {
		if a := attempts[i]; a.Action == delivery.ActionManual {
			at := a.StartedAt
			if a.FinishedAt != nil {
				at = *a.FinishedAt
			}
			return fmt.Sprintf("resolved by %s at %s (%s)", a.Worker, clock(at), a.Outcome)
		}
	}
	return ""
}

// resolve settles a parked task as SENT or FAILED through notifier_resolve(), as notifier resolve does,
// with the signed-in operator's name on the MANUAL attempt. One audit line per request.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request, sess *session) {
	id, ok := taskID(r)
	if !ok {
		s.fail(w, r, sess, http.StatusNotFound, "No such task.")
		return
	}
	final := delivery.State(r.PostFormValue("state"))
	note := strings.TrimSpace(r.PostFormValue("note"))
	if final != delivery.StateSent && final != delivery.StateFailed {
		s.metrics.resolves.WithLabelValues("other", "invalid").Inc()
		s.renderTask(w, r, sess, id, http.StatusBadRequest, "Choose Resolve SENT or Resolve FAILED.")
		return
	}
	if note == "" {
		s.metrics.resolves.WithLabelValues(string(final), "invalid").Inc()
		s.renderTask(w, r, sess, id, http.StatusBadRequest, "A note is required: say what the provider's console or support showed.")
		return
	}
	ip := remoteIP(r)
	ctx, cancel := s.dbContext(r)
	defer cancel()
	changed, err := s.cfg.Notifier.ResolveManually(ctx, id, final, note, sess.user)
	if errors.Is(err, delivery.ErrInvalidInput) {
		s.metrics.resolves.WithLabelValues(string(final), "invalid").Inc()
		s.cfg.Log.Info("console: resolve refused", "task", id, "state", final, "operator", sess.user, "remote", ip, "error", err)
		s.renderTask(w, r, sess, id, http.StatusBadRequest, err.Error())
		return
	}
	if err != nil {
		s.metrics.resolves.WithLabelValues(string(final), "error").Inc()
		s.cfg.Log.Error("console: resolve failed", "task", id, "state", final, "operator", sess.user, "remote", ip, "error", err)
		s.fail(w, r, sess, http.StatusInternalServerError, "The resolve failed in the database; nothing was changed. See the console's log.")
		return
	}
	if changed {
		s.metrics.resolves.WithLabelValues(string(final), "resolved").Inc()
		s.cfg.Log.Info("resolved", "task", id, "state", final, "operator", sess.user, "via", "console", "remote", ip)
		http.Redirect(w, r, fmt.Sprintf("/?resolved=%d&as=%s", id, final), http.StatusSeeOther)
		return
	}
	why := s.whyUnchanged(ctx, id)
	s.metrics.resolves.WithLabelValues(string(final), "unchanged").Inc()
	s.cfg.Log.Info("resolve changed nothing", "task", id, "state", final, "operator", sess.user, "via", "console", "remote", ip, "reason", why)
	s.renderTask(w, r, sess, id, http.StatusConflict, why)
}

// whyUnchanged tells the operator why their resolve changed nothing.
func (s *Server) whyUnchanged(ctx context.Context, id int64) string {
	task, err := s.cfg.Notifier.Task(ctx, id)
	if errors.Is(err, delivery.ErrNotFound) {
		return fmt.Sprintf("Nothing changed: there is no task %d.", id)
	}
	if err != nil {
		return "Nothing changed (reading the task failed)."
	}
	attempts, err := s.cfg.Notifier.Attempts(ctx, id)
	if err == nil {
		if res := resolution(attempts); res != "" {
			return fmt.Sprintf("Nothing changed: task %d was already %s.", id, res)
		}
	}
	return fmt.Sprintf("Nothing changed: task %d is not parked (state %s); only a task waiting for review can be resolved.", id, task.State)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	st, err := s.cfg.Notifier.Status(ctx)
	if err != nil {
		s.dbFailed(w, r, sess, "status", err)
		return
	}
	v := s.viewFor(sess, "Status")
	v.Status = &st
	s.render(w, r, http.StatusOK, "status", v)
}

// dbFailed logs a failed database call and says so without its details (they stay in the log).
func (s *Server) dbFailed(w http.ResponseWriter, r *http.Request, sess *session, op string, err error) {
	s.cfg.Log.Error("console: "+op+" failed", "error", err)
	msg := "The database call failed. See the console's log."
	var perm *service.PermissionError
	if errors.As(err, &perm) {
		msg = "The console's database user lacks the " + perm.Role + " role."
	}
	s.fail(w, r, sess, http.StatusInternalServerError, msg)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, sess *session, code int, msg string) {
	v := view{Title: http.StatusText(code), Error: msg, Now: s.cfg.Now()}
	if sess != nil {
		v = s.viewFor(sess, http.StatusText(code))
		v.Error = msg
	}
	s.render(w, r, code, "error", v)
}

// render writes a page whole or not at all: a template error is a 500, never half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, page string, v view) {
	var buf bytes.Buffer
	if err := s.pages[page].Execute(&buf, v); err != nil {
		s.cfg.Log.Error("console: render "+page, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// Template functions.

func clock(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// age is how long ago t was, to the second under a minute, else to the minute.
func age(now, t time.Time) string {
	d := now.Sub(t)
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// seconds is a count of seconds as a duration, to the second.
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}

func latency(a service.AttemptRecord) string {
	if a.FinishedAt == nil {
		return "open"
	}
	return a.FinishedAt.Sub(a.StartedAt).Round(time.Millisecond).String()
}

// excerpt is the start of a body for the list (the task page shows it whole).
func excerpt(s string) string {
	const max = 160
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	return string([]rune(s)[:max]) + "…"
}
