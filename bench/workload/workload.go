// Package workload is what both sides of the load bench deliver, ours (bench/load) and the River peer
// (bench/river): the same users, channels, submitters and retry rules, so that their figures compare.
package workload

import (
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

const (
	// Users is how many users the events are spread over, each with push and sms enabled.
	Users = 1000
	// Submitters is how many goroutines create (or insert) events at once.
	Submitters = 8
	// MaxAttempts of each delivery: River's default. At --call-errors 0.5, the most allowed, one
	// delivery in 33 million is refused this many times in a row (and fails the bench's check).
	MaxAttempts = 25
	// CallTimeout bounds each channel call on both sides.
	CallTimeout = 10 * time.Second
)

// Channels every event goes out on: push is idempotent, sms queryable (fakes.Push, fakes.SMS).
var Channels = []string{"push", "sms"}

// RetryBackoff spaces the retries of a refused send (a 503 of --call-errors) on both sides: 200 ms
// doubled per attempt. Shorter than a worker's default (2 s) so that a run's tail is the protocol's
// work, not its waiting.
var RetryBackoff = delivery.Backoff{Base: 200 * time.Millisecond, Max: 10 * time.Second}
