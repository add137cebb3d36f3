// Package redact keeps secrets out of what notifier prints: database and channel URLs, libpq
// key=value connection strings, and free text (errors, a tool's output) that may hold either. It is
// the one place these rules live; the CLI, the channel adapters and the test harness all use it.
//
// What counts as a secret: the password of a URL's userinfo and the value of any password=...
// (password, sslpassword, PGPASSWORD, in a URL's query or a key=value string). A user name is not a
// secret: it stays, so an operator can still tell which account an error is about.
//
// The rules are conservative, because the strings that reach an error message are often exactly the
// ones that failed to parse, and a password is allowed to hold any character:
//
//   - After "scheme://", everything between the first ':' and the last '@' of the rest of the text is
//     the password, whatever lies between ("postgres://u:S3cr@tPass!@host" masks "S3cr@tPass!"; a
//     '/', '?', '#', space or "://" inside it changes nothing). A '@' later in the text (an email
//     address in an error) makes more of the text disappear, never less; a password= before that
//     '@' hides everything after "scheme://".
//   - A password=... value hides everything to the end of the text, quoted or not: a password may
//     hold unescaped quotes and spaces, so `password='a' b=c` may be a password and a parameter or
//     one password, and no reading of it is certain.
//
// When in doubt more is dropped; a password is never printed, not even in part.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

var (
	// scheme is the start of a URL with an authority: scheme://.
	scheme = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.\-]*://`)
	// passwordKey is the key of a password value in a query or a key=value string, with its '='.
	passwordKey = regexp.MustCompile(`(?i)password[ \t\r\n\f\v]*=[ \t\r\n\f\v]*`)
)

// Text is s with every URL password and every password=... value replaced by Mask (see the package
// comment for where a password ends).
func Text(s string) string {
	var b strings.Builder
	for s != "" {
		// Ifs rather than a tagless switch, whose case expressions coverage profiles (and so
		// `just mutants`) do not count as statements.
		u, k := scheme.FindStringIndex(s), passwordKey.FindStringIndex(s)
		if k != nil && (u == nil || k[0] < u[0]) {
			// Where the value ends cannot be known: `password='a' b=c` may be a password and a
			// parameter or one password with an unescaped quote. Nothing after it is shown.
			b.WriteString(s[:k[1]])
			b.WriteString(Mask)
			return b.String()
		}
		if u == nil { // and no password= either
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:u[1]])
		rest := s[u[1]:]
		at := strings.LastIndexByte(rest, '@')
		if at < 0 {
			s = rest // no userinfo; a query may still hold a password=
			continue
		}
		if passwordKey.MatchString(rest[:at]) {
			// A password= value before the last '@' may run on past it: nothing after scheme://
			// can be shown with certainty.
			b.WriteString(Mask)
			return b.String()
		}
		colon := strings.IndexByte(rest[:at], ':')
		if colon < 0 {
			s = rest // a user name without a password
			continue
		}
		b.WriteString(rest[:colon]) // the user name stays
		b.WriteString(":" + Mask + "@")
		s = rest[at+1:]
	}
	return b.String()
}

// URL is raw (a database, channel, proxy or webhook URL, or a key=value connection string) without
// its password: Text applied to one value. The user name, host, path and query stay.
func URL(raw string) string { return Text(raw) }

// Origin is scheme://host of a URL whose path or query may identify a person or carry a token (a
// webhook subscriber URL, a push endpoint), for errors and logs; "(unparsable URL)" when it has none.
func Origin(raw string) string {
	u, err := url.Parse(strings.TrimSpace(Text(raw))) // the password is gone before anything is parsed
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host
}

// Error is err's text for a log or an attempt's error column: a request error (*url.Error) names its
// URL by Origin only, and the rest goes through Text.
func Error(err error) string {
	if err == nil {
		return ""
	}
	var uerr *url.Error
	if errors.As(err, &uerr) && err == error(uerr) {
		return uerr.Op + " " + Origin(uerr.URL) + ": " + Error(uerr.Err)
	}
	return Text(err.Error())
}

// Known is text (say, another program's output) with each of the given secrets replaced by Mask
// wherever it appears: verbatim, query-escaped or path-escaped, then Text. Secrets shorter than 3
// bytes are left to Text: replacing every "a" would garble the text and still not hide "a".
func Known(text string, secrets ...string) string {
	for _, s := range secrets {
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			if len(form) >= 3 {
				text = strings.ReplaceAll(text, form, Mask)
			}
		}
	}
	return Text(text)
}

// Scrub is text with the passwords of the given URLs or key=value strings replaced wherever they
// appear (Known), then Text: for another program's output or an error that may quote a password
// outside any URL, e.g. a server's "password authentication failed" message or a misparsed host name.
func Scrub(text string, conns ...string) string {
	var secrets []string
	for _, c := range conns {
		secrets = append(secrets, passwords(c)...)
	}
	return Known(text, secrets...)
}

// passwords are every reading of the password in conn: the conservative one, net/url's, a query's,
// and a key=value string's (quoted or to the next space). More readings only mean more replacements.
func passwords(conn string) []string {
	var out []string
	if pw, ok := URLPassword(conn); ok {
		out = append(out, pw)
		if raw, _ := rawURLPassword(conn); raw != pw {
			out = append(out, raw)
		}
	}
	if u, err := url.Parse(conn); err == nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		}
		out = append(out, u.Query()["password"]...)
	}
	for _, loc := range passwordKey.FindAllStringIndex(conn, -1) {
		v := conn[loc[1]:]
		if v != "" && (v[0] == '\'' || v[0] == '"') {
			if end := strings.LastIndexByte(v, v[0]); end > 0 {
				out = append(out, v[1:end], strings.NewReplacer(`\\`, `\`, `\'`, `'`).Replace(v[1:end]))
			}
			v = v[1:]
		}
		if end := strings.IndexAny(v, " \t\r\n&"); end >= 0 {
			v = v[:end]
		}
		out = append(out, v)
	}
	return out
}

// rawURLPassword is URLPassword before percent-decoding.
func rawURLPassword(raw string) (string, bool) {
	loc := scheme.FindStringIndex(raw)
	if loc == nil || loc[0] != 0 {
		return "", false
	}
	rest := raw[loc[1]:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return "", false
	}
	colon := strings.IndexByte(rest[:at], ':')
	if colon < 0 {
		return "", false
	}
	return rest[colon+1 : at], true
}

// URLPassword is the password the conservative reading finds in raw's userinfo (everything between
// the first ':' after scheme:// and the last '@'), percent-decoded where it can be; ok is false when
// raw has none. A caller compares it with what its parser read: when they differ, the URL is
// ambiguous (a password with an unescaped '@', '/', '?', '#' or space) and is refused rather than
// used, or printed, as the parser misread it.
func URLPassword(raw string) (password string, ok bool) {
	pw, ok := rawURLPassword(raw)
	if !ok {
		return "", false
	}
	if decoded, err := url.PathUnescape(pw); err == nil {
		pw = decoded
	}
	return pw, true
}

// Misread reports whether a parser read raw's password otherwise than the conservative reading
// (URLPassword): parsedPassword is what the parser found ("" for none). When they differ, the
// password holds an unescaped '@', '/', '?', '#' or space, so part of it went into the host, port,
// path or query: the URL would reach somewhere else with a wrong password, and every error would
// quote that part. Callers refuse such a URL, each with its own message; a raw without a password in
// its userinfo is never misread.
func Misread(raw, parsedPassword string) bool {
	pw, ok := URLPassword(raw)
	return ok && pw != parsedPassword
}
