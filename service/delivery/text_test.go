package delivery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
)

// A wait is lengthened by up to a quarter, at random: never shorter, never more, and not always by the
// same amount (the waits of a batch's retries, and the polls of many workers, do not go together).
func TestSpreadLengthensByUpToAQuarter(t *testing.T) {
	is := is.New(t)
	const d = time.Second
	lo, hi := time.Hour, time.Duration(0)
	seen := map[time.Duration]bool{}
	for range 1000 {
		got := delivery.Spread(d)
		lo, hi = min(lo, got), max(hi, got)
		seen[got] = true
	}
	is.True(lo >= d && hi <= d+d/4)                                   // never shorter, at most a quarter longer
	is.True(lo < 1050*time.Millisecond && hi > 1200*time.Millisecond) // and really spread
	is.True(len(seen) > 500)                                          // not a fixed lengthening
}

func TestTruncateMakesStorableText(t *testing.T) {
	is := is.New(t)
	is.Equal(delivery.Truncate("short", 10), "short")             // kept
	is.Equal(delivery.Truncate("héllo wörld", 5), "héllo")        // characters, not bytes
	is.Equal(delivery.Truncate("a\x00b\xffc", 10), "a?b?c")       // NUL and invalid UTF-8, which text refuses
	is.Equal(delivery.Truncate(strings.Repeat("é", 3), 3), "ééé") // exactly n
	is.Equal(delivery.Truncate("x\xff\xfe\xfdy", 3), "x?y")       // a run of invalid bytes is one "?"
	is.Equal(delivery.Truncate("", 0), "")                        // empty
	is.Equal(len([]rune(delivery.Truncate(strings.Repeat("ü", 600), 500))), 500)
}

func TestOneLine(t *testing.T) {
	is := is.New(t)
	is.Equal(delivery.OneLine("  bad\r\n\tkey \n value ", 100), "bad key value") // every run of white space one space
	is.Equal(delivery.OneLine("abc def", 5), "abc d")                            // bounded
	is.Equal(delivery.OneLine("a\x00\xffb", 5), "a??b")                          // storable
}

func TestSubject(t *testing.T) {
	is := is.New(t)
	is.Equal(delivery.Subject("[Shop] ", "\n  Shipped  \nmore"), "[Shop] Shipped") // the first non-empty line, trimmed
	is.Equal(delivery.Subject("", "one\r\ntwo"), "one")                            // CRLF
	is.Equal(delivery.Subject("", "one\rtwo"), "one")                              // a lone CR ends a line too
	is.Equal(delivery.Subject("", " \n "), "Notification")                         // nothing to title it with
	long := delivery.Subject("", strings.Repeat("ö", 200))
	is.Equal(len([]rune(long)), delivery.MaxSubjectRunes) // bounded
	is.True(strings.HasSuffix(long, "…"))                 // and says it was cut
	exact := strings.Repeat("ö", delivery.MaxSubjectRunes)
	is.Equal(delivery.Subject("", exact), exact)    // exactly the bound: kept whole
	is.Equal(delivery.Subject("", "a\xffb"), "a?b") // valid UTF-8
}
