package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// benchSizes are the record value sizes every benchmark runs with.
var benchSizes = []int{128, 1 << 10, 16 << 10}

// benchPaths names the two ways a client reaches the broker. The
// sub-benchmark names use key=value pairs so that benchstat can pivot on
// them, e.g. `benchstat -col /path bench.txt`.
var benchPaths = []string{"direct", "proxy"}

// benchAddr returns the address a client of path should bootstrap from:
// the broker itself, or a proxy started in front of it.
func benchAddr(b *testing.B, c *kfake.Cluster, path string) string {
	b.Helper()
	if path == "direct" {
		return c.ListenAddrs()[0]
	}
	return startProxy(b, c.ListenAddrs(), nil).Addr()
}

// benchValue returns n bytes that do not compress.
func benchValue(n int) []byte {
	v := make([]byte, n)
	x := uint32(2463534242)
	for i := range v {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		v[i] = byte(x)
	}
	return v
}

// BenchmarkProduce produces records asynchronously (pipelined, as a real
// producer does) to a broker that discards them; one op is one record.
// Allocations include the client's, so compare the two paths: the
// difference is the proxy's.
func BenchmarkProduce(b *testing.B) {
	for _, path := range benchPaths {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("path=%s/size=%d", path, size), func(b *testing.B) {
				c := newCluster(b, kfake.NumBrokers(1), kfake.BlackholeProduce(), kfake.SeedTopics(6, "bench"))
				addr := benchAddr(b, c, path)
				cl := newClient(b, addr,
					kgo.DefaultProduceTopic("bench"),
					kgo.ProducerBatchCompression(kgo.NoCompression()),
					// Few records outstanding when the loop ends, so the
					// untimed tail is negligible.
					kgo.MaxBufferedRecords(2048),
				)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("warm-up")}).FirstErr(); err != nil {
					b.Fatalf("warm-up produce via %s: %v", path, err)
				}
				value := benchValue(size)
				var failed atomic.Int64
				var firstErr atomic.Pointer[error]
				done := func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, &err)
					}
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					cl.Produce(ctx, &kgo.Record{Value: value}, done)
				}
				if err := cl.Flush(ctx); err != nil {
					b.Fatalf("flush: %v", err)
				}
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d records failed, first: %v", n, *firstErr.Load())
				}
			})
		}
	}
}

// BenchmarkFetch consumes a broker that answers every fetch from a canned
// batch of 16 KiB of records; one op is one record.
func BenchmarkFetch(b *testing.B) {
	for _, path := range benchPaths {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("path=%s/size=%d", path, size), func(b *testing.B) {
				c := newCluster(b, kfake.NumBrokers(1), kfake.BlackholeProduce(), kfake.SeedTopics(6, "bench"),
					kfake.SyntheticFetch(kfake.SyntheticBatch{RecordBytes: size, Records: max(1, (16<<10)/size)}))
				addr := benchAddr(b, c, path)
				cl := newClient(b, addr,
					kgo.ConsumeTopics("bench"),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				var recs []*kgo.Record
				next := func() {
					for len(recs) == 0 {
						fs := cl.PollFetches(ctx)
						if err := fs.Err0(); err != nil {
							b.Fatalf("fetch via %s: %v", path, err)
						}
						recs = fs.Records()
					}
					if got := len(recs[0].Value); got != size {
						b.Fatalf("record of %d bytes, want %d", got, size)
					}
					recs = recs[1:]
				}
				next() // warm-up: dial, metadata, first fetch
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					next()
				}
				if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
					b.Fatalf("benchmark ran out of time: %v", err)
				}
			})
		}
	}
}
