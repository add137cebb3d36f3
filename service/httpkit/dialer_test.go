package httpkit

import (
	"testing"
	"time"

	"github.com/matryer/is"
)

// TestDialerBounds: a connect that gets no answer ends (every network call has a timeout), and pooled
// connections are probed. The dialer hides inside the transport's DialContext, so it is read here.
func TestDialerBounds(t *testing.T) {
	is := is.New(t)
	is.Equal(dialer.Timeout, 5*time.Second)    // a connect is bounded
	is.Equal(dialer.KeepAlive, 30*time.Second) // TCP keep-alive on pooled connections
}
