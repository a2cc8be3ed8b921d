package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
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
	Load   string         `json:"load"` // "idle" or "loaded"
	Direct latencySummary `json:"direct"`
	Proxy  latencySummary `json:"proxy"`
	Added  latencySummary `json:"added"` // proxy minus direct, per percentile
	// Relay is the bare relay in kproxy's place (idle run only), and
	// OverRelay what kproxy adds over it.
	Relay     *latencySummary    `json:"relay,omitempty"`
	OverRelay *latencySummary    `json:"proxy_over_relay,omitempty"`
	BGMBps    map[string]float64 `json:"background_mb_per_s,omitempty"`
}

type latencySummary struct {
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
}

// minus is a - b per percentile.
func minus(a, b latencySummary) latencySummary {
	return latencySummary{P50Ms: a.P50Ms - b.P50Ms, P99Ms: a.P99Ms - b.P99Ms, P999Ms: a.P999Ms - b.P999Ms}
}

func summarize(l []time.Duration) latencySummary {
	s := sortedCopy(l)
	return latencySummary{N: len(s), P50Ms: ms(percentile(s, 0.5)), P99Ms: ms(percentile(s, 0.99)), P999Ms: ms(percentile(s, 0.999))}
}

// openLoopRuns measures mode's requests at o.rate, direct, through ch
// and through a bare relay, idle and then under a background load of the
// same mode on every path at once. The paths are measured together,
// their requests interleaved one by one, so that whatever else the
// machine does in the meantime (on a VM, the host's other guests too)
// falls on every path alike; measured one after the other, a burst of
// host activity during one path's turn moved its p99 by milliseconds.
func openLoopRuns(ctx context.Context, o options, mode, broker string, ch *child) (*openLoopResult, error) {
	res := &openLoopResult{Rate: o.rate, Seconds: o.rateDur.Seconds()}
	var rl *relay
	if o.rateRelay {
		cpu := -1
		if o.pin {
			cpu = proxyCPU
		}
		var err error
		if rl, err = startRelay(broker, cpu); err != nil {
			return nil, err
		}
		defer rl.stop()
	}
	for _, loaded := range []bool{false, true} {
		if loaded && o.rateBGConns == 0 {
			continue
		}
		names, addrs := []string{"direct", "proxy"}, []string{broker, ch.addr}
		if rl != nil && (!loaded || o.rateBGMBps > 0) {
			names, addrs = append(names, "relay"), append(addrs, rl.addr)
		}
		if err := ch.repin(); err != nil {
			return nil, err
		}
		var (
			bgWG   sync.WaitGroup
			bgS    = make([]sample, len(addrs))
			bgErrs = make([]error, len(addrs))
		)
		if loaded {
			for i, a := range addrs {
				bgWG.Go(func() {
					// Covers the whole latency run.
					bgS[i], bgErrs[i] = background(ctx, o, mode, a, warmup+o.rateDur+warmup)
				})
			}
			if err := sleepCtx(ctx, warmup); err != nil {
				return nil, err
			}
		}
		lats, _, err := openLoop(ctx, addrs, mode, o.rate, o.recordSize, o.rateDur)
		bgWG.Wait()
		if err != nil {
			return nil, err
		}
		bg := map[string]float64{}
		for i, name := range names {
			if bgErrs[i] != nil {
				return nil, fmt.Errorf("%s background load: %w", name, bgErrs[i])
			}
			if loaded {
				bg[name] = mbps(bgS[i].payload, bgS[i].elapsed)
			}
		}
		run := openLoopPaths{Load: "idle", Direct: summarize(lats[0]), Proxy: summarize(lats[1])}
		if loaded {
			run.Load, run.BGMBps = "loaded", bg
		}
		run.Added = minus(run.Proxy, run.Direct)
		if len(lats) > 2 {
			r := summarize(lats[2])
			over := minus(run.Proxy, r)
			run.Relay, run.OverRelay = &r, &over
		}
		slog.Info("open-loop latency", "mode", mode, "load", run.Load, "added_p99_ms", fmt.Sprintf("%.3f", run.Added.P99Ms))
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// openLoop sends mode's request rate times a second for d on one raw
// connection to each of addrs, whatever the answers do (open loop: a
// slow answer does not delay the next request), the connections taking
// turns request by request, and returns each connection's latencies,
// from the moment a request is queued on its connection to its answer.
// Queueing never waits (loadgen's writer goroutine sends what is queued),
// so a stall still counts against every request queued behind it (no
// coordinated omission); what is left out is the load generator's own
// timer lateness (a Go timer fires up to about a millisecond late), which
// is no part of any path and was most of the measured p50 when latency
// was counted from the scheduled send time.
//
// It also returns the payload the answered requests moved: the record
// bytes produced, or the fetched response bytes.
func openLoop(ctx context.Context, addrs []string, mode string, rate, recordSize int, d time.Duration) ([][]time.Duration, int64, error) {
	conns := make([]*loadgen.Conn, len(addrs))
	reqs := make([]kmsg.Request, len(addrs))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i, addr := range addrs {
		c, err := loadgen.Dial(ctx, addr, loadgen.DialConfig{ClientID: "kbench-rate"})
		if err != nil {
			return nil, 0, err
		}
		conns[i] = c
		if reqs[i], err = openLoopRequest(ctx, c, mode, recordSize); err != nil {
			return nil, 0, err
		}
		// One unmeasured request: the broker's side of the connection warms.
		if err := rawRequest(ctx, c, reqs[i]); err != nil {
			return nil, 0, fmt.Errorf("%s warm-up via %s: %w", mode, addr, err)
		}
	}
	n := int(d.Seconds() * float64(rate))
	lats := make([][]time.Duration, len(addrs))
	for i := range lats {
		lats[i] = make([]time.Duration, n)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error // guarded by mu
		moved atomic.Int64
	)
	interval := time.Second / time.Duration(rate*len(addrs))
	t0 := time.Now()
	for i := range n * len(addrs) {
		at := t0.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			if err := sleepCtx(ctx, w); err != nil {
				return nil, 0, err
			}
		}
		path, k := i%len(addrs), i/len(addrs)
		wg.Add(1)
		queued := time.Now()
		conns[path].DoRaw(reqs[path], func(size int, err error) {
			lats[path][k] = time.Since(queued)
			if mode == modeProduce {
				size = recordSize
			}
			moved.Add(int64(size))
			if err != nil {
				mu.Lock()
				first = cmp.Or(first, fmt.Errorf("%s via %s: %w", mode, addrs[path], err))
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
		return nil, 0, fmt.Errorf("%s via %v: answers missing 30s after the last request", mode, addrs)
	}
	if first != nil {
		return nil, 0, first
	}
	return lats, moved.Load(), nil
}

// bgRecordSize is the record of each produce request of a paced
// background load: one 64 KiB record, a batch as a busy producer sends.
const bgRecordSize = 64 << 10

// background is the load of a loaded open-loop run, for d on addr:
// paced to --rate-load-mbps on --rate-load-conns raw connections, open
// loop like the measured requests (produces of one 64 KiB record, or
// fetches of one batch), so that every path, the relay included, moves
// the same bytes; with --rate-load-mbps 0, Kafka clients as fast as the
// path goes (produceSlice, fetchSlice) and no relay. It returns what
// moved.
func background(ctx context.Context, o options, mode, addr string, d time.Duration) (sample, error) {
	if o.rateBGMBps <= 0 {
		bo := o
		bo.conns = o.rateBGConns
		if mode == modeProduce {
			return produceSlice(ctx, bo, addr, d-2*warmup, meter{})
		}
		return fetchSlice(ctx, bo, addr, d-2*warmup, meter{})
	}
	per := float64(bgRecordSize) // bytes per request
	if mode == modeFetch {
		per = float64(o.batchBytes)
	}
	rate := max(1, int(o.rateBGMBps*1e6/per/float64(o.rateBGConns)))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error // guarded by mu
		total atomic.Int64
	)
	start := time.Now()
	for range o.rateBGConns {
		wg.Go(func() {
			_, moved, err := openLoop(ctx, []string{addr}, mode, rate, bgRecordSize, d)
			total.Add(moved)
			if err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return sample{payload: total.Load(), elapsed: time.Since(start)}, first
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
	fmt.Fprintf(w, "\nopen-loop latency, %s at %d req/s (from each request's queueing), %.0fs per load, the paths' requests interleaved:\n", mode, r.Rate, r.Seconds)
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
		if run.Relay != nil {
			r, o := run.Relay, run.OverRelay
			bg := "-"
			if run.BGMBps != nil {
				bg = fmt.Sprintf("%.1f", run.BGMBps["relay"])
			}
			fmt.Fprintf(tw, "%s\trelay\t%d\t%.3f\t%.3f\t%.3f\t%s\t\n", run.Load, r.N, r.P50Ms, r.P99Ms, r.P999Ms, bg)
			fmt.Fprintf(tw, "%s\tproxy-relay\t\t%+.3f\t%+.3f\t%+.3f\t\t\n", run.Load, o.P50Ms, o.P99Ms, o.P999Ms)
		}
	}
	tw.Flush()
	for _, run := range r.Runs {
		verdict := "ok"
		if run.Added.P99Ms >= 0.2 {
			verdict = "MISSED"
		}
		floor := ""
		if run.Relay != nil {
			floor = fmt.Sprintf(" (a bare relay adds %+.3f, kproxy over it %+.3f)", run.Relay.P99Ms-run.Direct.P99Ms, run.OverRelay.P99Ms)
		}
		fmt.Fprintf(w, "goal %s %s: p99 added %+.3f ms < 0.2 %s%s\n", mode, run.Load, run.Added.P99Ms, verdict, floor)
	}
}
