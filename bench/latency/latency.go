// Package latency is the load bench's model of a real provider, applied in the fake channels' server so
// that every client of the fakes (our worker, the River peer) meets the same one: each send is
// accepted, then answered after a delay drawn from a lognormal distribution (ln(delay) ~
// N(ln(median), sigma)), and a share of sends is answered 503 before acceptance (refused: retried by
// the protocol, never a new message). Real providers answer in 50-500 ms with a long tail; fakes that
// answer at once measure only the database and the client's CPU.
//
// Draws come from a seeded generator, one per channel, so a run can be repeated: the same seed gives
// each channel the same sequence of answers. Which task meets which draw depends on the order in
// which requests arrive, which no seed fixes.
package latency

import (
	"container/heap"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/notifierhq/notifier/fakes"
)

// Bounds of the model's parameters: beyond them a run measures timeouts, not latency.
const (
	MaxMedian = time.Minute
	MaxSigma  = 3.0
	MaxErrors = 0.5
)

// Model is a provider's latency and refusals. The zero Model answers at once and never refuses.
type Model struct {
	Median time.Duration // median delay between acceptance and the answer; 0: at once
	Sigma  float64       // standard deviation of ln(delay)
	Errors float64       // share of sends answered 503 before acceptance
	Seed   uint64
}

// Instant reports whether sends are answered at once (no delay drawn).
func (m Model) Instant() bool { return m.Median == 0 }

// Quantile is the model's delay at probability p (0 < p < 1), from the normal's quantile function.
func (m Model) Quantile(p float64) time.Duration {
	if m.Instant() {
		return 0
	}
	return time.Duration(float64(m.Median) * math.Exp(m.Sigma*math.Sqrt2*math.Erfinv(2*p-1)))
}

// Spec is the --call-latency value that gives this model: "100ms,0.8", or "instant".
func (m Model) Spec() string {
	if m.Instant() {
		return "instant"
	}
	return m.Median.String() + "," + strconv.FormatFloat(m.Sigma, 'g', -1, 64)
}

// String describes the model for a report's header.
func (m Model) String() string {
	s := "answered at once"
	if !m.Instant() {
		s = fmt.Sprintf("lognormal latency, median %s, sigma %g (p90 %s, p99 %s)", m.Median, m.Sigma,
			m.Quantile(0.90).Round(time.Millisecond), m.Quantile(0.99).Round(time.Millisecond))
	}
	if m.Errors > 0 {
		s += fmt.Sprintf(", %g%% of sends answered 503 before acceptance", 100*m.Errors)
	}
	return s + fmt.Sprintf(", seed %d", m.Seed)
}

// Report is the model in a bench's JSON report; both sides print the same object.
type Report struct {
	Spec     string  `json:"spec"` // as given to --call-latency
	MedianMS float64 `json:"median_ms"`
	Sigma    float64 `json:"sigma"`
	P90MS    float64 `json:"p90_ms"` // of the model, not measured
	P99MS    float64 `json:"p99_ms"`
	Errors   float64 `json:"errors"` // share of sends answered 503 before acceptance
	Seed     uint64  `json:"seed"`
}

// Report is m as printed in JSON.
func (m Model) Report() Report {
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	return Report{Spec: m.Spec(), MedianMS: ms(m.Median), Sigma: m.Sigma, P90MS: ms(m.Quantile(0.90)),
		P99MS: ms(m.Quantile(0.99)), Errors: m.Errors, Seed: m.Seed}
}

// Parse reads MEDIAN[,SIGMA] ("100ms,0.8"); "", "0" and "instant" mean no delay.
func Parse(s string) (median time.Duration, sigma float64, err error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" || s == "instant" {
		return 0, 0, nil
	}
	medianText, sigmaText, hasSigma := strings.Cut(s, ",")
	median, err = time.ParseDuration(strings.TrimSpace(medianText))
	if err != nil || median <= 0 || median > MaxMedian {
		return 0, 0, fmt.Errorf("%q: want MEDIAN,SIGMA with a median from 1ns to %s, e.g. 100ms,0.8", s, MaxMedian)
	}
	if hasSigma {
		sigma, err = strconv.ParseFloat(strings.TrimSpace(sigmaText), 64)
		if err != nil || !(sigma >= 0 && sigma <= MaxSigma) {
			return 0, 0, fmt.Errorf("%q: want MEDIAN,SIGMA with a sigma from 0 to %g, e.g. 100ms,0.8", s, MaxSigma)
		}
	}
	return median, sigma, nil
}

// Flags registers --call-latency, --call-errors and --seed on fs; call the returned function after
// fs.Parse for the model, or the error naming the bad flag.
func Flags(fs *flag.FlagSet) func() (Model, error) {
	spec := fs.String("call-latency", "instant", "provider latency MEDIAN,SIGMA: each send is accepted, then answered after a lognormal delay, ln(delay) ~ N(ln(MEDIAN), SIGMA); e.g. 100ms,0.8 (p99 ~640ms); instant: at once")
	errs := fs.Float64("call-errors", 0, fmt.Sprintf("share of sends answered 503 before acceptance, retried by the protocol (0-%g)", MaxErrors))
	seed := fs.Uint64("seed", 1, "seed of the latency and error draws (printed with the figures): the same seed gives the same draws")
	return func() (Model, error) {
		median, sigma, err := Parse(*spec)
		if err != nil {
			return Model{}, fmt.Errorf("invalid --call-latency %w", err)
		}
		if !(*errs >= 0 && *errs <= MaxErrors) {
			return Model{}, fmt.Errorf("invalid --call-errors %v: want a share from 0 to %g", *errs, MaxErrors)
		}
		return Model{Median: median, Sigma: sigma, Errors: *errs, Seed: *seed}, nil
	}
}

// Sampler draws one channel's answers. Safe for concurrent use.
type Sampler struct {
	m     Model
	mu    sync.Mutex
	rng   *rand.Rand
	steps int // answers drawn (SendStep, QueryStep)
}

// NewSampler draws for stream number stream of the model's seed (one stream per channel, so one
// channel's draws do not depend on how its requests interleave with another's).
func (m Model) NewSampler(stream uint64) *Sampler {
	return &Sampler{m: m, rng: rand.New(rand.NewPCG(m.Seed, stream))}
}

// Delay draws one answer's delay.
func (s *Sampler) Delay() time.Duration {
	if s.m.Instant() {
		return 0
	}
	s.mu.Lock()
	z := s.rng.NormFloat64()
	s.mu.Unlock()
	return time.Duration(float64(s.m.Median) * math.Exp(s.m.Sigma*z))
}

// Refused draws whether a send is answered 503 before acceptance.
func (s *Sampler) Refused() bool {
	if s.m.Errors == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64() < s.m.Errors
}

// SendStep is the fakes' answer to one send: a 503 before acceptance, or acceptance answered after a
// delay (fakes.Step.Delay is waited after acceptance is recorded: a provider's latency).
func (s *Sampler) SendStep() fakes.Step {
	s.counted()
	if s.Refused() {
		return fakes.Step{Status: 503}
	}
	return fakes.Step{Delay: s.Delay()}
}

// QueryStep is the fakes' answer to one status query: the same latency, never refused (the protocol
// queries only after an uncertain send).
func (s *Sampler) QueryStep() fakes.Step {
	s.counted()
	return fakes.Step{Delay: s.Delay()}
}

func (s *Sampler) counted() {
	s.mu.Lock()
	s.steps++
	s.mu.Unlock()
}

// Steps is how many answers (sends and queries) the sampler has drawn.
func (s *Sampler) Steps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// Steps is how many answers the samplers have drawn together: a phase's, from the samplers Apply gave
// it.
func Steps(samplers []*Sampler) int {
	n := 0
	for _, s := range samplers {
		n += s.Steps()
	}
	return n
}

// Apply makes the channels answer by the model, each from its own stream of draws (by its position in
// channels), once their scripted queues are empty, from the first draw of each stream: a phase that
// applies the model again meets the same answers as any other that did, whatever came before it. It
// returns the channels' samplers (none for the instant model without errors, which changes nothing).
func (m Model) Apply(channels ...*fakes.Channel) ([]*Sampler, error) {
	if m.Instant() && m.Errors == 0 {
		return nil, nil
	}
	samplers := make([]*Sampler, len(channels))
	for i, c := range channels {
		if c == nil {
			return nil, errors.New("latency: no channel")
		}
		s := m.NewSampler(uint64(i))
		c.SetFallback(s.SendStep, s.QueryStep)
		samplers[i] = s
	}
	return samplers, nil
}

// FirstDelays is the delays of the first perChannel sends to each of channels channels applied by the
// model (the stream of each, from its start), taken in turn: the first send of channel 0, of channel 1,
// ..., then the second of each. Nil when the model answers at once or refuses sends (a refused send
// is retried after a backoff, which no list of delays describes).
func (m Model) FirstDelays(channels, perChannel int) []time.Duration {
	if m.Instant() || m.Errors > 0 || channels <= 0 || perChannel <= 0 {
		return nil
	}
	samplers := make([]*Sampler, channels)
	for i := range samplers {
		samplers[i] = m.NewSampler(uint64(i))
	}
	delays := make([]time.Duration, 0, channels*perChannel)
	for range perChannel {
		for _, s := range samplers {
			delays = append(delays, s.Delay())
		}
	}
	return delays
}

// Bound is the window's bound of a phase of perChannel sends to each of channels channels against
// the model's first answers: WindowBound over FirstDelays. 0 where FirstDelays has no list.
func (m Model) Bound(channels, perChannel, window int) float64 {
	return WindowBound(m.FirstDelays(channels, perChannel), window)
}

// WindowBound is the deliveries per second of a worker that holds window calls in flight and starts
// the next call, in the order of delays, the moment one answers: no claim, no finish and no client
// time, only the providers' answers. It bounds what a worker with that window can deliver against
// these answers: with a long tail, the run ends with the slowest of its last calls, whatever the
// worker does. 0 without delays or window.
func WindowBound(delays []time.Duration, window int) float64 {
	if len(delays) == 0 || window <= 0 {
		return 0
	}
	ends := make(endHeap, 0, window) // when each call in flight answers
	var last time.Duration
	for _, d := range delays {
		start := time.Duration(0)
		if len(ends) == window {
			start = heap.Pop(&ends).(time.Duration)
		}
		heap.Push(&ends, start+d)
	}
	for len(ends) > 0 {
		last = heap.Pop(&ends).(time.Duration)
	}
	if last <= 0 {
		return 0
	}
	return float64(len(delays)) / last.Seconds()
}

// endHeap is a min-heap of answer times.
type endHeap []time.Duration

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
