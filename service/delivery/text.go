package delivery

import (
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"
)

// Spread lengthens a wait d by up to a quarter, at random, so that what waits together (a window's
// retries after a provider's outage, the polls of many workers, the claims of workers whose database
// comes back) does not go again in lockstep. Never shorter: a wait is at least what it was computed to
// be (a Retry-After, a settle time).
func Spread(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*float64(d)/4)
}

// Truncate makes s storable as PostgreSQL text of at most n characters: whatever a channel answered,
// a finish must not fail on it (and lose the observations of its whole batch). Invalid UTF-8 and NUL,
// which PostgreSQL text refuses, become "?".
func Truncate(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "?")
	r := []rune(s)
	return string(r[:min(n, len(r))])
}

// OneLine is s with every run of white space (line breaks included) made one space, as Truncate
// makes it storable, at most n characters: a provider's or a parser's message quoted in one line of
// an error or a log.
func OneLine(s string, n int) string {
	return Truncate(strings.Join(strings.Fields(s), " "), n)
}

// MaxSubjectRunes bounds an email's subject (prefix + the body's first line).
const MaxSubjectRunes = 120

// Subject is an email's subject for a body: prefix + the body's first non-empty line, trimmed, at
// most MaxSubjectRunes characters (cut with "…"), valid UTF-8; "Notification" when both are empty.
// Every email channel (SMTP, Resend, Postmark) titles a message so.
func Subject(prefix, body string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(strings.ReplaceAll(body, "\r", "\n")), "\n")
	subject := strings.TrimSpace(prefix + first)
	if subject == "" {
		subject = "Notification"
	}
	if utf8.RuneCountInString(subject) > MaxSubjectRunes {
		subject = string([]rune(subject)[:MaxSubjectRunes-1]) + "…"
	}
	return strings.ToValidUTF8(subject, "?")
}
