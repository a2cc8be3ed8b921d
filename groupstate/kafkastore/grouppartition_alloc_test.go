package kafkastore

import (
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestGroupPartitionAllocs pins that locating a group allocates at most
// a few hundred bytes (the key and its record): GroupPartition runs on
// every group request, and building a partitioner per call allocated a
// 4.9 KB math/rand source (issue 12).
func TestGroupPartitionAllocs(t *testing.T) {
	var sink int32
	r := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			sink += GroupPartition("some-consumer-group", 50)
		}
	})
	if per := r.AllocedBytesPerOp(); per > 512 {
		t.Fatalf("GroupPartition allocates %d bytes per call, want at most 512", per)
	}
	_ = sink
}

// TestGroupPartitionConcurrent: the shared partitioner gives the same
// partition as a fresh one, from many goroutines at once (run with -race).
func TestGroupPartitionConcurrent(t *testing.T) {
	groups := []string{"", "a", "orders", "some-consumer-group", "ünïcode"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 200 {
				g, n := groups[i%len(groups)], 1+i%60
				want := int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(g)}, n))
				if got := GroupPartition(g, n); got != want {
					t.Errorf("GroupPartition(%q, %d) = %d, a fresh partitioner says %d", g, n, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkGroupPartition(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		GroupPartition("some-consumer-group", 50)
	}
}
