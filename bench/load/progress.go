package load

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress is the bench's progress bar on stderr: one line redrawn in place a few times a second. It
// draws nothing unless enabled (stderr is a terminal and the output is not --json), so logs and pipes
// stay clean.
type progress struct {
	w       io.Writer
	label   string
	total   int64
	n       atomic.Int64
	started time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
}

// isTerminal reports whether w is a character device (a terminal), without a dependency.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// startProgress starts a bar for total units; with w nil it only counts.
func startProgress(w io.Writer, label string, total int) *progress {
	p := &progress{w: w, label: label, total: int64(total), started: time.Now(), stop: make(chan struct{})}
	if w == nil {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

// Add counts n more units done.
func (p *progress) Add(n int) { p.n.Add(int64(n)) }

// Done draws the final state and ends the line.
func (p *progress) Done() {
	if p.w == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.draw(true)
}

func (p *progress) draw(final bool) {
	const width = 30
	n, elapsed := p.n.Load(), time.Since(p.started)
	frac := 0.0
	if p.total > 0 {
		frac = min(1, float64(n)/float64(p.total))
	}
	filled := int(frac * width)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(n) / s
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r%-10s [%s%s] %d/%d %3.0f%% %7.0f/s %6.1fs \x1b[K%s", p.label,
		strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, p.total, 100*frac, rate, elapsed.Seconds(), end)
}
