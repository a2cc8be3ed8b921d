package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/loadgen"
)

// openLoopResult is the --rate run of one mode: latency percentiles of
// each path, idle and under a background throughput load, and what
// kproxy adds.
type openLoopResult struct {
	Rate    int             `json:"rate_per_s"`
	Seconds float64         `json:"seconds_per_path"`
	Runs    []openLoopPaths `json:"runs"`
}

// openLoopPaths is one condition (idle or loaded) on both paths.
type openLoopPaths struct {
	Load   string             `json:"load"` // "idle" or "loaded"
	Direct latencySummary     `json:"direct"`
	Proxy  latencySummary     `json:"proxy"`
	Added  latencySummary     `json:"added"` // proxy minus direct, per percentile
	BGMBps map[string]float64 `json:"background_mb_per_s,omitempty"`
}

type latencySummary struct {
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
}

func summarize(l []time.Duration) latencySummary {
	s := sortedCopy(l)
	return latencySummary{N: len(s), P50Ms: ms(percentile(s, 0.5)), P99Ms: ms(percentile(s, 0.99)), P999Ms: ms(percentile(s, 0.999))}
}

// openLoopRuns measures mode's requests at o.rate, direct and through
// ch, idle and then under a background load of the same mode on the
// same path; each path gets two alternating halves of o.rateDur.
func openLoopRuns(ctx context.Context, o options, mode, broker string, ch *child) (*openLoopResult, error) {
	res := &openLoopResult{Rate: o.rate, Seconds: o.rateDur.Seconds()}
	paths := []struct{ name, addr string }{{"direct", broker}, {"proxy", ch.addr}}
	for _, loaded := range []bool{false, true} {
		if loaded && o.rateBGConns == 0 {
			continue
		}
		lats := map[string][]time.Duration{}
		bg := map[string]float64{}
		for range 2 {
			for _, p := range paths {
				if err := ch.repin(); err != nil {
					return nil, err
				}
				var (
					bgWG  sync.WaitGroup
					bgS   sample
					bgErr error
				)
				if loaded {
					bo := o
					bo.conns = o.rateBGConns
					bgWG.Go(func() {
						// Measures the middle of the latency run.
						if mode == modeProduce {
							bgS, bgErr = produceSlice(ctx, bo, p.addr, o.rateDur/2, meter{})
						} else {
							bgS, bgErr = fetchSlice(ctx, bo, p.addr, o.rateDur/2, meter{})
						}
					})
					if err := sleepCtx(ctx, warmup); err != nil {
						return nil, err
					}
				}
				l, err := openLoop(ctx, p.addr, mode, o.rate, o.recordSize, o.rateDur/2)
				bgWG.Wait()
				if err != nil {
					return nil, fmt.Errorf("%s: %w", p.name, err)
				}
				if bgErr != nil {
					return nil, fmt.Errorf("%s background load: %w", p.name, bgErr)
				}
				lats[p.name] = append(lats[p.name], l...)
				if loaded {
					bg[p.name] += mbps(bgS.payload, bgS.elapsed) / 2
				}
			}
		}
		run := openLoopPaths{Load: "idle", Direct: summarize(lats["direct"]), Proxy: summarize(lats["proxy"])}
		if loaded {
			run.Load, run.BGMBps = "loaded", bg
		}
		run.Added = latencySummary{
			P50Ms:  run.Proxy.P50Ms - run.Direct.P50Ms,
			P99Ms:  run.Proxy.P99Ms - run.Direct.P99Ms,
			P999Ms: run.Proxy.P999Ms - run.Direct.P999Ms,
		}
		slog.Info("open-loop latency", "mode", mode, "load", run.Load, "added_p99_ms", fmt.Sprintf("%.3f", run.Added.P99Ms))
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// openLoop sends mode's request at rate per second for d on one raw
// connection to addr, whatever the answers do (open loop: a slow answer
// does not delay the next request), and returns each request's latency
// from its scheduled send time to its answer, so that a stall counts
// against every request it delays (no coordinated omission).
func openLoop(ctx context.Context, addr, mode string, rate, recordSize int, d time.Duration) ([]time.Duration, error) {
	c, err := loadgen.Dial(ctx, addr, loadgen.DialConfig{ClientID: "kbench-rate"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req, err := openLoopRequest(ctx, c, mode, recordSize)
	if err != nil {
		return nil, err
	}
	// One unmeasured request: the broker's side of the connection warms.
	if err := rawRequest(ctx, c, req); err != nil {
		return nil, fmt.Errorf("%s warm-up via %s: %w", mode, addr, err)
	}
	n := int(d.Seconds() * float64(rate))
	lats := make([]time.Duration, n)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error // guarded by mu
	)
	interval := time.Second / time.Duration(rate)
	t0 := time.Now()
	for i := range n {
		at := t0.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			if err := sleepCtx(ctx, w); err != nil {
				return nil, err
			}
		}
		wg.Add(1)
		c.DoRaw(req, func(_ int, err error) {
			lats[i] = time.Since(at)
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%s via %s: answers missing 30s after the last request", mode, addr)
	}
	if first != nil {
		return nil, fmt.Errorf("%s via %s: %w", mode, addr, first)
	}
	return lats, nil
}

func rawRequest(ctx context.Context, c *loadgen.Conn, req kmsg.Request) error {
	errc := make(chan error, 1)
	c.DoRaw(req, func(_ int, err error) { errc <- err })
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openLoopRequest is the one request an open-loop run repeats: a produce
// of one record (acks=1) to partition 0, or a fetch of one batch from
// the start of partition 0.
func openLoopRequest(ctx context.Context, c *loadgen.Conn, mode string, recordSize int) (kmsg.Request, error) {
	topic := produceTopic
	if mode == modeFetch {
		topic = fetchTopic
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	resp, err := loadgen.Request(ctx, c, mreq)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	mresp := resp.(*kmsg.MetadataResponse)
	if len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		return nil, fmt.Errorf("metadata for %s: unexpected answer", topic)
	}
	id := mresp.Topics[0].TopicID
	if mode == modeFetch {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 500, 1, 50<<20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic, ft.TopicID = topic, id
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.PartitionMaxBytes = 1 // the broker still returns one whole batch
		fp.CurrentLeaderEpoch, fp.LastFetchedEpoch, fp.LogStartOffset = -1, -1, -1
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		return req, nil
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = 1, 10000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic, pt.TopicID = topic, id
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = oneRecordBatch(randomValue(recordSize), time.Now().UnixMilli())
	pt.Partitions = append(pt.Partitions, pp)
	req.Topics = append(req.Topics, pt)
	return req, nil
}

// oneRecordBatch encodes a v2 record batch of one uncompressed record
// with value v, its CRC-32C over everything after the CRC field.
func oneRecordBatch(v []byte, ts int64) []byte {
	rec := kmsg.Record{Value: v}
	rec.Length = int32(len(rec.AppendTo(nil)) - 1) // the zero length is one varint byte
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1,
		Magic:                2,
		FirstTimestamp:       ts,
		MaxTimestamp:         ts,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           1,
		Records:              rec.AppendTo(nil),
	}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[8:], uint32(len(out)-12)) // after offset and length
	crc := crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli))
	binary.BigEndian.PutUint32(out[17:], crc)
	return out
}

// print writes the open-loop table of mode; nothing without a run.
func (r *openLoopResult) print(w io.Writer, mode string) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "\nopen-loop latency, %s at %d req/s (from the scheduled send time), %.0fs per path per load:\n", mode, r.Rate, r.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tpath\tn\tp50 ms\tp99 ms\tp999 ms\tbackground MB/s\t")
	for _, run := range r.Runs {
		for _, p := range []struct {
			name string
			s    latencySummary
		}{{"direct", run.Direct}, {"proxy", run.Proxy}} {
			bg := "-"
			if run.BGMBps != nil {
				bg = fmt.Sprintf("%.1f", run.BGMBps[p.name])
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%s\t\n", run.Load, p.name, p.s.N, p.s.P50Ms, p.s.P99Ms, p.s.P999Ms, bg)
		}
		fmt.Fprintf(tw, "%s\tadded\t\t%+.3f\t%+.3f\t%+.3f\t\t\n", run.Load, run.Added.P50Ms, run.Added.P99Ms, run.Added.P999Ms)
	}
	tw.Flush()
	for _, run := range r.Runs {
		verdict := "ok"
		if run.Added.P99Ms >= 0.2 {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "goal %s %s: p99 added %+.3f ms < 0.2 %s\n", mode, run.Load, run.Added.P99Ms, verdict)
	}
}
