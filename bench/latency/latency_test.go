package latency

import (
	"context"
	"flag"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
)

// The sampler's draws follow the lognormal it claims: median, spread and p99 over many draws with a
// fixed seed, within generous bounds.
func TestSamplerIsLognormal(t *testing.T) {
	is := is.New(t)
	m := Model{Median: 100 * time.Millisecond, Sigma: 0.8, Seed: 42}
	s := m.NewSampler(0)
	const n = 20000
	draws := make([]time.Duration, n)
	logs := make([]float64, n)
	for i := range draws {
		draws[i] = s.Delay()
		logs[i] = math.Log(draws[i].Seconds())
	}
	slices.Sort(draws)
	median := draws[n/2]
	is.True(median > 95*time.Millisecond && median < 105*time.Millisecond) // the median is MEDIAN
	mean := 0.0
	for _, l := range logs {
		mean += l
	}
	mean /= n
	variance := 0.0
	for _, l := range logs {
		variance += (l - mean) * (l - mean)
	}
	sigma := math.Sqrt(variance / (n - 1))
	is.True(math.Abs(mean-math.Log(0.1)) < 0.03) // ln(delay) centred on ln(MEDIAN)
	is.True(sigma > 0.76 && sigma < 0.84)        // and spread by SIGMA
	p99 := draws[n*99/100]
	want := m.Quantile(0.99)
	is.True(want > 630*time.Millisecond && want < 655*time.Millisecond) // 100ms,0.8 has a p99 of ~640ms
	is.True(p99 > want*85/100 && p99 < want*115/100)                    // and the draws reach it

	again := m.NewSampler(0)
	first := make([]time.Duration, 5)
	for i := range first {
		first[i] = again.Delay()
	}
	other := Model{Median: 100 * time.Millisecond, Sigma: 0.8, Seed: 42}.NewSampler(0)
	for i := range first {
		is.Equal(other.Delay(), first[i]) // the same seed and stream give the same draws
	}
	is.True(m.NewSampler(1).Delay() != first[0]) // another stream (channel) draws its own
}

func TestSamplerErrorsShare(t *testing.T) {
	is := is.New(t)
	s := Model{Errors: 0.1, Seed: 7}.NewSampler(0)
	refused := 0
	const n = 20000
	for range n {
		step := s.SendStep()
		if step.Status == 503 {
			refused++
		}
		is.Equal(step.Delay, time.Duration(0)) // instant: no delay drawn
	}
	is.True(refused > n*8/100 && refused < n*12/100) // about 10% refused
	never := Model{Median: time.Millisecond}.NewSampler(0)
	for range 1000 {
		is.Equal(never.SendStep().Status, 0) // no errors asked, none drawn
	}
}

func TestParse(t *testing.T) {
	is := is.New(t)
	m, s, err := Parse("100ms,0.8")
	is.NoErr(err)                     // the documented form
	is.Equal(m, 100*time.Millisecond) // median
	is.Equal(s, 0.8)                  // sigma
	m, s, err = Parse("250ms")        // sigma left out: a constant delay
	is.NoErr(err)                     // accepted
	is.Equal(m, 250*time.Millisecond) // median
	is.Equal(s, 0.0)                  // no spread
	for _, instant := range []string{"", "0", "instant"} {
		m, _, err = Parse(instant)
		is.NoErr(err)                 // the instant model
		is.Equal(m, time.Duration(0)) // no delay
	}
	for _, bad := range []string{"100", "-1ms,0.5", "0ms,0.5", "100ms,x", "100ms,-0.1", "100ms,4", "2m,0.5"} {
		_, _, err = Parse(bad)
		is.True(err != nil) // refused
	}
	for _, edge := range []string{"1m,0.5", "100ms,0", "100ms,3"} {
		_, _, err = Parse(edge)
		is.NoErr(err) // the bounds themselves are allowed (a median up to MaxMedian, a sigma from 0 to MaxSigma)
	}
}

func TestFlags(t *testing.T) {
	is := is.New(t)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	model := Flags(fs)
	is.NoErr(fs.Parse([]string{"--call-latency", "5ms,0.5", "--call-errors", "0.05", "--seed", "9"}))
	m, err := model()
	is.NoErr(err)                                                                             // valid flags
	is.Equal(m, Model{Median: 5 * time.Millisecond, Sigma: 0.5, Errors: 0.05, Seed: 9})       // as given
	is.Equal(m.Report().Spec, "5ms,0.5")                                                      // reported as given
	is.True(strings.Contains(m.String(), "median 5ms") && strings.Contains(m.String(), "5%")) // described

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	model = Flags(fs)
	is.NoErr(fs.Parse([]string{"--call-errors", "0.6"}))
	_, err = model()
	is.True(err != nil && strings.Contains(err.Error(), "--call-errors")) // more than half refused: a bad flag

	for _, share := range []string{"0", "0.5"} {
		fs = flag.NewFlagSet("t", flag.ContinueOnError)
		model = Flags(fs)
		is.NoErr(fs.Parse([]string{"--call-errors", share}))
		_, err = model()
		is.NoErr(err) // none refused, and half: both allowed
	}
}

// Apply makes a real fake answer by the model: a delay after acceptance, 503 before it.
func TestApplyOnFake(t *testing.T) {
	is := is.New(t)
	push := fakes.Start(fakes.Push)
	defer push.Close()
	samplers, err := Model{Median: 30 * time.Millisecond, Seed: 1}.Apply(push)
	is.NoErr(err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, push.URL()+"/send", strings.NewReader(`{"ref":"task-1","to":"a","body":"b"}`))
	resp, err := http.DefaultClient.Do(req)
	is.NoErr(err)
	resp.Body.Close()
	is.Equal(len(samplers), 1)                        // one sampler per channel
	is.Equal(samplers[0].Steps(), 1)                  // which drew the one answer
	is.Equal(Steps(append(samplers, samplers[0])), 2) // the samplers' answers, summed
	is.Equal(resp.StatusCode, 200)                    // accepted
	is.True(time.Since(t0) >= 30*time.Millisecond)    // after the model's (constant) delay
	is.Equal(push.Outbound("task-1"), 1)              // one message

	sms := fakes.Start(fakes.SMS)
	defer sms.Close()
	samplers, err = Model{Errors: 0.5, Seed: 3}.Apply(sms)
	is.NoErr(err)
	statuses := map[int]int{}
	for i := range 40 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sms.URL()+"/send", strings.NewReader(`{"ref":"task-`+string(rune('a'+i%26))+`","to":"a","body":"b"}`))
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err)
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	is.True(statuses[503] > 5 && statuses[200] > 5) // both answers drawn
	is.Equal(sms.TotalOutbound(), statuses[200])    // a 503 never created a message
	is.Equal(samplers[0].Steps(), 40)               // every answer drawn, refused ones included

	none, err := Model{}.Apply(push) // instant, no errors: nothing to draw
	is.NoErr(err)
	is.Equal(len(none), 0)
}

// Applying the model again starts each channel's answers from the first draw of its stream: a phase
// that applies it meets the same answers whatever was drawn before.
func TestApplyRestartsTheDraws(t *testing.T) {
	is := is.New(t)
	push := fakes.Start(fakes.Push)
	defer push.Close()
	m := Model{Median: 2 * time.Millisecond, Sigma: 2, Seed: 5}
	want := m.NewSampler(0).Delay()
	send := func(ref string) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, push.URL()+"/send", strings.NewReader(`{"ref":"`+ref+`","to":"a","body":"b"}`))
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		is.NoErr(err)
		resp.Body.Close()
		return time.Since(t0)
	}
	_, err := m.Apply(push)
	is.NoErr(err)
	for i := range 5 {
		send("task-a" + string(rune('0'+i)))
	}
	samplers, err := m.Apply(push)
	is.NoErr(err)
	is.Equal(samplers[0].Steps(), 0) // a new phase has drawn nothing
	took := send("task-b")
	is.True(took >= want)            // the answer took the stream's first draw
	is.Equal(samplers[0].Steps(), 1) // and drew it from the new sampler
	next := m.NewSampler(0)
	next.Delay()
	is.Equal(samplers[0].Delay(), next.Delay()) // the sampler goes on from the stream's second draw
}

// The model's descriptions and report say what it is; a draw is MEDIAN x exp(SIGMA x z) for the
// stream's next normal z.
func TestModelReportAndDraw(t *testing.T) {
	is := is.New(t)
	m := Model{Median: 5 * time.Millisecond, Sigma: 0.25, Seed: 3}
	is.Equal(m.Spec(), "5ms,0.25")                // sigma at full precision
	is.True(!strings.Contains(m.String(), "503")) // no refused sends, none described
	is.True(strings.Contains(Model{Errors: 0.1}.String(), "10% of sends answered 503"))
	r := Model{Median: 100 * time.Millisecond, Sigma: 0.8}.Report()
	is.Equal(r.MedianMS, 100.0)             // in milliseconds
	is.True(r.P99MS > 640 && r.P99MS < 645) // 100 ms x exp(0.8 x 2.326)

	z := rand.New(rand.NewPCG(3, 0)).NormFloat64()
	is.Equal(m.NewSampler(0).Delay(), time.Duration(float64(5*time.Millisecond)*math.Exp(0.25*z)))
}

// FirstDelays takes the channels' streams in turn, from their start; none for a model without delays
// or with refused sends.
func TestFirstDelays(t *testing.T) {
	is := is.New(t)
	m := Model{Median: 100 * time.Millisecond, Sigma: 0.8, Seed: 9}
	got := m.FirstDelays(2, 3)
	is.Equal(len(got), 6)
	a, b := m.NewSampler(0), m.NewSampler(1)
	for i := 0; i < 6; i += 2 {
		is.Equal(got[i], a.Delay())   // channel 0's next draw
		is.Equal(got[i+1], b.Delay()) // then channel 1's
	}
	is.Equal(m.Bound(2, 3, 2), WindowBound(got, 2))                           // the bound over those answers
	is.Equal(Model{}.Bound(2, 3, 2), 0.0)                                     // none without them
	is.True(Model{}.FirstDelays(2, 3) == nil)                                 // instant
	is.True(Model{Median: time.Second, Errors: 0.1}.FirstDelays(2, 3) == nil) // refused sends: no list describes the retries
	is.True(m.FirstDelays(0, 3) == nil)                                       // no channel
	is.True(m.FirstDelays(2, 0) == nil)                                       // no send
}

// WindowBound refills each slot the moment its call answers, in order, and ends with the last answer.
func TestWindowBound(t *testing.T) {
	is := is.New(t)
	ms := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Millisecond
		}
		return d
	}
	is.Equal(WindowBound(ms(100, 100, 100, 100), 2), 4/0.2)      // two slots, two calls each: 200 ms
	is.Equal(WindowBound(ms(100, 100, 100, 100), 4), 4/0.1)      // all at once: 100 ms
	is.Equal(WindowBound(ms(100, 100, 100, 100), 8), 4/0.1)      // a window larger than the work
	is.Equal(WindowBound(ms(300, 100, 100, 100), 2), 4/0.3)      // one slow call; the other slot takes the rest
	is.Equal(WindowBound(ms(100, 100, 100, 100, 500), 2), 5/0.7) // the last call's tail ends the run: 200 + 500
	is.Equal(WindowBound(ms(100, 50, 100), 2), 3/0.15)           // the third call takes the slot freed first (at 50 ms)
	is.Equal(WindowBound(nil, 2), 0.0)
	is.Equal(WindowBound(ms(0, 0), 2), 0.0) // answers that take no time: no pace to give
	is.Equal(WindowBound(ms(100), 0), 0.0)
}
