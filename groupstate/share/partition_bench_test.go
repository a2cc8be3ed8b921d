package share

import (
	"testing"
	"time"
)

// BenchmarkPollCycle is one member's poll with implicit acknowledgement:
// acquire 500 records of 5 batches, accept them all.
func BenchmarkPollCycle(b *testing.B) {
	p := NewPartition(0)
	now := t0
	o := int64(0)
	bs := make([]Batch, 5)
	b.ReportAllocs()
	for b.Loop() {
		for i := range bs {
			bs[i] = Batch{Base: o + int64(i)*100, Last: o + int64(i)*100 + 99}
		}
		got := p.Acquire("m", o, bs, 500, BatchOptimized, 500, now, lim)
		acks := make([]AckBatch, 0, len(got))
		for _, a := range got {
			acks = append(acks, AckBatch{First: a.First, Last: a.Last, Types: []AckType{AckAccept}})
		}
		if c := p.Acknowledge("m", acks, now, lim); c != 0 {
			b.Fatal(c)
		}
		o += 500
		now = now.Add(time.Millisecond)
	}
}

// BenchmarkFragmented measures the worst case the limits allow: 2000
// records in flight whose states alternate every offset (per-offset
// releases), then a fetch over all of them.
func BenchmarkFragmented(b *testing.B) {
	types := make([]AckType, 2000)
	for i := range types {
		types[i] = AckType(1 + i%2) // accept, release, ...
	}
	types[0] = AckRelease // keep the SPSO at 0
	bs := []Batch{{Base: 0, Last: 1999}}
	b.ReportAllocs()
	runs := 0
	for b.Loop() {
		p := NewPartition(0)
		p.Acquire("m", 0, bs, 2000, BatchOptimized, 2000, t0, lim)
		p.Acknowledge("m", []AckBatch{{First: 0, Last: 1999, Types: types}}, t0, lim)
		runs = p.Stats().Runs
		p.Acquire("m2", 0, bs, 2000, BatchOptimized, 2000, t0, lim)
	}
	b.ReportMetric(float64(runs), "runs")
}
