package httpchannel_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/cputime"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// BenchmarkSend is one channel call as the bench makes it: this client posting to an in-process push
// fake over loopback, 8 calls at a time. cpu-us/op is the process's CPU per call, both ends of the HTTP
// exchange (the fake's share would run elsewhere in production). It bounds how close the per-task bench
// can come to pgbench, which makes no calls, on a machine whose cores the database shares.
func BenchmarkSend(b *testing.B) {
	fake := fakes.Start(fakes.Push)
	defer fake.Close()
	client, err := httpchannel.New(fake.URL(), httpchannel.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	b.SetParallelism(4) // 4 x GOMAXPROCS callers: 8 on the 2-core machine of docs/benchmarks.md#the-machine
	b.ReportAllocs()
	start := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ref := "task-" + strconv.FormatInt(seq.Add(1), 10)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			obs := client.Send(ctx, delivery.Message{Ref: ref, IdempotencyKey: "ntf-" + ref, To: "user-1", Body: "hello"})
			cancel()
			if obs.Outcome != delivery.OutcomeAccepted {
				b.Errorf("%s: %+v", ref, obs)
				return
			}
		}
	})
	b.StopTimer()
	cputime.ReportPerOp(b, start)
}
