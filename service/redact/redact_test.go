package redact_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/redact"
)

// TestReportedLeaks are the failures users reported, and their neighbours: each output is written
// out, so what stays visible is part of the contract too.
func TestReportedLeaks(t *testing.T) {
	cases := []struct{ in, want, secret string }{
		// A '@' in a URL password: the old pattern stopped at the first '@' and printed "tPass!@host".
		{"postgres://u:S3cr@tPass!@host/db", "postgres://u:xxxxx@host/db", "tPass"},
		{"postgres://u:S3cr%40tPass!@host/db", "postgres://u:xxxxx@host/db", "tPass"},
		// libpq key=value with an unterminated quote: the old pattern printed "def".
		{"host=h user=u password='abc def dbname=x", "host=h user=u password=xxxxx", "def"},
		{"host=h user=u password='abc def' dbname=x", "host=h user=u password=xxxxx", "abc"},
		{`host=h password='it\'s me' dbname=x`, "host=h password=xxxxx", "s me"},
		{"host=h password='a' x='b", "host=h password=xxxxx", "b"}, // one password or two values: unknowable
		{`host=h password=abc\ def dbname=x`, "host=h password=xxxxx", "def"},
		{"host=h password = 'p w' sslmode=require", "host=h password = xxxxx", "p w"},
		{"host=h password='abc'def dbname=x", "host=h password=xxxxx", "def"},
		{"host=h PASSWORD=abc", "host=h PASSWORD=xxxxx", "abc"},
		// Channel URLs whose password holds '/', a space or '@'.
		{"http://user:pa/ss@host:8080/base", "http://user:xxxxx@host:8080/base", "ss"},
		{"http://user:pa ss@host/base", "http://user:xxxxx@host/base", "ss"},
		{"http://user:p@ss@host/base", "http://user:xxxxx@host/base", "ss"},
		{"https://user:a://b?c#d@host/", "https://user:xxxxx@host/", "b?c"},
		{"push=idempotent,http://user:p@ss w/rd@127.0.0.1:8081", "push=idempotent,http://user:xxxxx@127.0.0.1:8081", "rd"},
		// Query passwords (libpq URLs): to the end, since an unescaped '&' could be part of them.
		{"postgres://app@db.example/notifier?password=s3cr%23t-pw", "postgres://app@db.example/notifier?password=xxxxx", "s3cr"},
		{"postgres://app@db/x?sslmode=require&password=a&b=c", "postgres://app@db/x?sslmode=require&password=xxxxx", "b=c"},
		{"https://h:80/x?password=a@b", "https://xxxxx", "b"},
		// Several hosts, and URLs inside error text.
		{"postgres://u:pw@h1:5432,h2:5432/db", "postgres://u:xxxxx@h1:5432,h2:5432/db", "pw@"},
		{`cannot parse "postgres://u:S3cr@tPass!@host/db": invalid userinfo`, `cannot parse "postgres://u:xxxxx@host/db": invalid userinfo`, "tPass"},
		{"dial postgres://u:pw@h/db failed; mail ops@example.com", "dial postgres://u:xxxxx@example.com", "pw"},
		// An empty user name: the password is still one.
		{"postgres://:s3cret@host/db", "postgres://:xxxxx@host/db", "s3cret"},
		// Nothing secret: unchanged.
		{"https://host:8443/path?q=1", "https://host:8443/path?q=1", ""},
		{"https://token@github.com/x", "https://token@github.com/x", ""}, // a user name is not a password
		{"host=db.example user=app dbname=notifier", "host=db.example user=app dbname=notifier", ""},
		{"http://[::1]:8080/send", "http://[::1]:8080/send", ""},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			is := is.New(t)
			got := redact.Text(c.in)
			is.Equal(got, c.want) // exactly what stays visible
			if c.secret != "" {
				is.True(!strings.Contains(got, c.secret)) // no part of the password
			}
			is.Equal(redact.URL(c.in), got) // URL is Text on one value
		})
	}
}

func TestOrigin(t *testing.T) {
	is := is.New(t)
	is.Equal(redact.Origin("https://hooks.example/t/abc?token=1"), "https://hooks.example")    // path and query dropped
	is.Equal(redact.Origin("https://u:12/ss@hooks.example/t/abc"), "https://hooks.example")    // a misread password is gone first
	is.Equal(redact.Origin("https://u:p@ss@push.example:8443/x"), "https://push.example:8443") // userinfo never shown
	is.Equal(redact.Origin("not a url"), "(unparsable URL)")                                   // nothing to show
	is.Equal(redact.Origin("https://u:pw@[bad/x"), "(unparsable URL)")                         // unparsable after masking
	is.True(!strings.Contains(redact.Origin("ht!tp://u:secret@h/x"), "secret"))                // a bad scheme shows nothing secret
	is.Equal(redact.Origin("http://127.0.0.1:1/send"), "http://127.0.0.1:1")                   // a plain URL
	is.Equal(redact.Origin("https://user:pa ss@host/x y"), "https://host")                     // spaces after masking
	is.Equal(redact.Origin(""), "(unparsable URL)")                                            // empty
	is.Equal(redact.Origin("postgres://app@db.example/x?password=x"), "postgres://db.example") // query gone
}

func TestError(t *testing.T) {
	is := is.New(t)
	uerr := &url.Error{Op: "Post", URL: "https://u:pa/ss@hooks.example/t/SECRETPATH", Err: errors.New("EOF")}
	is.Equal(redact.Error(uerr), "Post https://hooks.example: EOF") // the URL by origin only
	wrapped := fmt.Errorf("send: %w", uerr)
	got := redact.Error(wrapped)
	is.True(strings.HasPrefix(got, "send: "))    // a wrapped error keeps its context
	is.True(!strings.Contains(got, "ss@"))       // and loses the password
	is.Equal(redact.Error(nil), "")              // no error, no text
	is.Equal(redact.Error(errors.New("x")), "x") // plain text passes
}

func TestKnown(t *testing.T) {
	is := is.New(t)
	out := redact.Known(`auth failed for s3cr#t-pw, url postgres://app:s3cr%23t-pw@h/db, raw s3cr%23t-pw`, "s3cr#t-pw")
	is.True(!strings.Contains(out, "s3cr"))                         // every form of a known password
	is.Equal(redact.Known("a b a", "a"), "a b a")                   // too short to replace safely: left to Text
	is.Equal(redact.Known("ab abc abcd", "abc"), "ab xxxxx xxxxxd") // three bytes are replaced
}

// TestScrub: each reading of a connection's password is hidden wherever it appears in the text,
// even where Text alone would not see a password (a server's message, a misparsed host name).
func TestScrub(t *testing.T) {
	cases := []struct {
		name, conn, text string
		secrets          []string // none of them may be left in the output
		want             string   // the whole output, when given
	}{
		{"a URL password, percent-decoded and as written", "postgres://u:p%41ss@h/db",
			"password authentication failed for pAss (p%41ss)", []string{"pAss", "p%41ss"}, ""},
		{"net/url's reading, shorter than the conservative one", "postgres://u:pwd1@h/db?email=a@b",
			"host pwd1 unreachable", []string{"pwd1"}, "host xxxxx unreachable"},
		{"a query password, decoded", "postgres://h/db?password=q%20s",
			"auth failed: q s.", []string{"q s"}, "auth failed: xxxxx."},
		{"a key=value password", "host=h password=kv-secret user=u",
			"FATAL: kv-secret rejected", []string{"kv-secret"}, "FATAL: xxxxx rejected"},
		{"every password= of a connection string", "password=first-pw sslpassword=second-pw",
			"first-pw, second-pw", []string{"first-pw", "second-pw"}, "xxxxx, xxxxx"},
		{"a quoted value, whole and to its first space", "host=h password='s3 cret' user=u",
			"bad s3 cret, bad s3x", []string{"s3 cret"}, "bad xxxxx, bad s3x"},
		{"a double-quoted value", `host=h password="dq pw" user=u`,
			"was dq pw", []string{"dq pw"}, "was xxxxx"},
		{"an escaped quote", `host=h password='it\'s' user=u`,
			`it's or it\'s`, []string{"it's", `it\'s`}, ""},
		{"an unterminated quote", "host=h password='unterminated",
			"saw unterminated", []string{"unterminated"}, "saw xxxxx"},
		{"an empty query password hides nothing else", "postgres://h/db?password=&user=app&db=d",
			"query &user=app&db=d", nil, "query &user=app&db=d"},
		{"no password", "postgres://u@h/db", "user u on h", nil, "user u on h"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			got := redact.Scrub(c.text, c.conn)
			for _, s := range c.secrets {
				is.True(!strings.Contains(got, s)) // no reading of the password survives
			}
			if c.want != "" {
				is.Equal(got, c.want) // and nothing more is taken
			}
		})
	}
}

func TestURLPassword(t *testing.T) {
	is := is.New(t)
	for raw, want := range map[string]string{
		"postgres://u:S3cr@tPass!@host/db":   "S3cr@tPass!",
		"postgres://u:S3cr%40tPass!@host/db": "S3cr@tPass!",
		"postgres://u:12/ss@host/db":         "12/ss",
		"postgres://:pw@host":                "pw",
		"postgres://u:bad%zz@host":           "bad%zz", // not decodable: as written
	} {
		got, ok := redact.URLPassword(raw)
		is.True(ok)         // a password was found
		is.Equal(got, want) // the conservative reading
	}
	for _, raw := range []string{"postgres://u@host/db", "postgres://host/db?password=x", "host=h password=x", "x postgres://u:p@h"} {
		_, ok := redact.URLPassword(raw)
		is.True(!ok) // no userinfo password at the start of raw
	}
}

func TestMisread(t *testing.T) {
	is := is.New(t)
	for _, raw := range []string{"https://u:a#b@host/x", "https://u:12/ss@host/x", "https://u:a?b@host"} {
		u, err := url.Parse(raw)
		var got string
		if err == nil {
			got, _ = u.User.Password()
		}
		is.True(redact.Misread(raw, got)) // net/url read another password (or none) than the conservative reading
	}
	for _, raw := range []string{"https://u:S3cr%40tPass%21@host/x", "https://u@host/x", "https://host/x?password=y"} {
		u, err := url.Parse(raw)
		is.NoErr(err)
		got, _ := u.User.Password()
		is.True(!redact.Misread(raw, got)) // read alike, or no userinfo password at all
	}
}

// marker cannot occur in the fixed parts of the strings FuzzRedact builds, so any occurrence in the
// output is a piece of the password.
const marker = "pW9"

// FuzzRedact builds URLs, key=value strings and error texts around a password drawn from every
// character class (the fuzzer's bytes plus seeds with all ASCII punctuation, unicode, control
// characters) and checks that no piece of it survives: the password is written with the marker
// between every two of its characters (so even a one-character fragment carries a marker) or only
// around it, in every encoding a user or a library may produce.
//
//	go test -run '^$' -fuzz '^FuzzRedact$' -fuzztime 5m ./service/redact/
func FuzzRedact(f *testing.F) {
	punct := "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ "
	f.Add("S3cr@tPass!", uint8(0))
	f.Add(punct, uint8(1))
	f.Add("abc def", uint8(2))
	f.Add("it's \"me\"\\", uint8(3))
	f.Add("a://b@c/d?e#f", uint8(4))
	f.Add("pässwörd€😀", uint8(5))
	f.Add("\x00\x01\t\n\r\x7f", uint8(6))
	f.Add("x password=y", uint8(7))
	f.Add("\xff\xfe", uint8(8))
	f.Add("", uint8(9))
	f.Fuzz(func(t *testing.T, raw string, layout uint8) {
		var pw string
		if layout&1 == 0 { // the marker between every two characters
			var b strings.Builder
			b.WriteString(marker)
			for _, r := range raw {
				b.WriteRune(r)
				b.WriteString(marker)
			}
			pw = b.String()
		} else { // the marker around it
			pw = marker + raw + marker
		}
		libpq := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
		proper := (&url.URL{Scheme: "postgres", User: url.UserPassword("app", pw), Host: "db.example:5432", Path: "/notifier"}).String()
		forms := []string{
			proper,
			"postgres://app:" + pw + "@db.example:5432/notifier?sslmode=require",
			"http://app:" + url.PathEscape(pw) + "@db.example/base",
			"https://app:" + url.QueryEscape(pw) + "@db.example/base#frag",
			"postgres://app@db.example/notifier?sslmode=require&password=" + pw,
			"postgres://app@db.example/notifier?password=" + url.QueryEscape(pw) + "&sslmode=require",
			"host=db.example user=app password=" + libpq + " dbname=notifier",
			"host=db.example user=app password=" + pw + " dbname=notifier",
			"host=db.example user=app password='" + pw + "' dbname=notifier",
			"host=db.example user=app password='" + pw,
			"host=db.example password = \"" + pw + "\" dbname=x",
			"push=idempotent,http://app:" + pw + "@127.0.0.1:8081/base",
		}
		for _, form := range forms {
			texts := []string{
				redact.URL(form),
				redact.Text("cannot parse `" + form + "`: failed (bad) at ops@example.com"),
				redact.Text(fmt.Sprintf("parse %q: net/url: invalid userinfo", form)),
				redact.Origin(form),
				redact.Error(&url.Error{Op: "Post", URL: form, Err: errors.New("EOF")}),
				redact.Known("the server said: "+form, pw),
			}
			for _, out := range texts {
				if strings.Contains(out, marker) {
					t.Fatalf("a piece of the password %q survived in\n  %q\nfrom\n  %q", pw, out, form)
				}
			}
		}
		if got := redact.Text(raw); utf8.ValidString(raw) && !utf8.ValidString(got) {
			t.Fatalf("Text made valid UTF-8 invalid: %q -> %q", raw, got)
		}
	})
}
