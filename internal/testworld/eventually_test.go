package testworld

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/matryer/is"
)

// failRecorder is a testing.TB whose Fatalf records the message and ends the goroutine, as a test's
// would.
type failRecorder struct {
	testing.TB
	failed string
}

func (r *failRecorder) Helper() {}

func (r *failRecorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// eventually runs Eventually on a failRecorder and returns what it failed with ("" if it returned)
// and how long it took on the bubble's clock.
func eventually(timeout time.Duration, what string, cond func() bool) (string, time.Duration) {
	r := &failRecorder{}
	started := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(r, timeout, what, cond)
	}()
	<-done
	return r.failed, time.Since(started)
}

// Eventually returns as soon as the condition holds, and fails with what once the timeout has passed
// without it; its polls back off, so a long wait does not poll every millisecond.
func TestEventually(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		polls := 0
		failed, took := eventually(time.Second, "the third poll", func() bool { polls++; return polls == 3 })
		is.Equal(failed, "")               // it held: no failure
		is.Equal(polls, 3)                 // polled until it held, not beyond
		is.Equal(took, 3*time.Millisecond) // after 1 ms, then 2 ms

		polls = 0
		failed, took = eventually(time.Second, "a fact that never comes", func() bool { polls++; return false })
		is.True(strings.Contains(failed, "a fact that never comes"))            // names what it waited for
		is.True(strings.Contains(failed, "1s"))                                 // and for how long
		is.True(took >= time.Second && took <= time.Second+20*time.Millisecond) // not before the timeout, nor long after
		is.True(polls < 100)                                                    // backed off up to 20 ms: about 55 polls in a second
	})
}
