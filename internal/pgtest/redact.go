package pgtest

import (
	"net/url"
	"regexp"
	"strings"
)

const redacted = "xxxxx"

var (
	// scheme://user:password@ in free text.
	urlPasswordRE = regexp.MustCompile(`(://[^:/?#@\s]*:)[^@\s]*@`)
	// password=... in keyword/value connection strings (quoted or not).
	kvPasswordRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
)

// redactURL returns a connection URL (or keyword/value string) with its
// password replaced by xxxxx, for error messages and logs.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" {
		q := u.Query()
		if q.Has("password") {
			q.Set("password", redacted)
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return scrub(raw)
}

// scrub hides passwords in free text (e.g. a tool's output): those in URLs
// and password=... pairs, plus every password of the given URLs wherever it
// appears verbatim or escaped.
func scrub(text string, urls ...string) string {
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		var secrets []string
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
		if pw := u.Query().Get("password"); pw != "" {
			secrets = append(secrets, pw)
		}
		for _, pw := range secrets {
			for _, form := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
				if len(form) >= 3 { // do not blank out every "a"
					text = strings.ReplaceAll(text, form, redacted)
				}
			}
		}
	}
	text = urlPasswordRE.ReplaceAllString(text, "${1}"+redacted+"@")
	text = kvPasswordRE.ReplaceAllString(text, "${1}"+redacted)
	return text
}
