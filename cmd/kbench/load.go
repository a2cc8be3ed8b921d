package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// warmup is how long a throughput slice runs before it is measured, so
// that connection setup and pipeline fill are not counted.
const warmup = 500 * time.Millisecond

// e2eHook records, while active, the wire bytes of every request and the
// end-to-end latency (write start to response read) of requests of key.
type e2eHook struct {
	key    int16
	active atomic.Bool
	wire   atomic.Int64

	mu   sync.Mutex
	lats []time.Duration // guarded by mu
}

var _ kgo.HookBrokerE2E = (*e2eHook)(nil)

// OnBrokerE2E implements kgo.HookBrokerE2E.
func (h *e2eHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if !h.active.Load() {
		return
	}
	h.wire.Add(int64(e.BytesWritten + e.BytesRead))
	if key != h.key || e.WriteErr != nil || e.ReadErr != nil {
		return
	}
	h.mu.Lock()
	h.lats = append(h.lats, e.DurationE2E())
	h.mu.Unlock()
}

func (h *e2eHook) take() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.lats
	h.lats = nil
	return l
}

// sample is what one measured slice of one path produced.
type sample struct {
	payload  int64 // record value bytes acknowledged or consumed
	wire     int64 // request+response bytes on the client's sockets
	elapsed  time.Duration
	proxyCPU time.Duration  // the kproxy child's CPU; zero on the direct path
	selfCPU  time.Duration  // kbench's own CPU: clients and broker
	machCPU  time.Duration  // every CPU of the machine, softirq included (paths.go)
	proc     procCounts     // syscalls and context switches of the process behind the path; zero on the direct path
	rounds   []roundFigures // per slice, when s sums several (report.go)
	lats     []time.Duration
	errs     int64
}

// meter snapshots the counters a slice is measured with.
type meter struct {
	cpu      func() (time.Duration, error) // the child's CPU, nil on the direct path
	tls      *tls.Config                   // the clients speak TLS (tls.go)
	redirect *[2]string                    // the clients dial [1] for [0] (paths.go)
	repin    func() error                  // pins the process behind the path again, if pinned
	pid      int                           // the process behind the path (syscalls.go); 0 on the direct path
}

type snapshot struct {
	at       time.Time
	payload  int64
	wire     int64
	proxyCPU time.Duration
	selfCPU  time.Duration
	machCPU  time.Duration
	proc     procCounts // the process behind the path (syscalls.go)
}

func (m meter) snap(payload *atomic.Int64, h *e2eHook) (snapshot, error) {
	s := snapshot{at: time.Now(), payload: payload.Load(), wire: h.wire.Load(), selfCPU: selfCPU()}
	mc, err := machineCPU()
	if err != nil {
		return s, err
	}
	s.machCPU = mc
	if m.cpu != nil {
		c, err := m.cpu()
		if err != nil {
			return s, err
		}
		s.proxyCPU = c
	}
	if m.pid != 0 {
		c, err := readProcCounts(m.pid)
		if err != nil {
			return s, err
		}
		s.proc = c
	}
	return s, nil
}

func diff(a, b snapshot) sample {
	return sample{
		payload:  b.payload - a.payload,
		wire:     b.wire - a.wire,
		elapsed:  b.at.Sub(a.at),
		proxyCPU: b.proxyCPU - a.proxyCPU,
		selfCPU:  b.selfCPU - a.selfCPU,
		machCPU:  b.machCPU - a.machCPU,
		proc:     procCounts{syscalls: b.proc.syscalls - a.proc.syscalls, switches: b.proc.switches - a.proc.switches},
	}
}

// measure runs load until ctx ends, measuring the window [warmup,
// warmup+d) of it. start launches the load and returns a function that
// stops it and releases its clients.
func measure(ctx context.Context, d time.Duration, m meter, h *e2eHook, payload *atomic.Int64, errs *atomic.Int64, start func(context.Context) (func(), error)) (sample, error) {
	lctx, cancel := context.WithCancel(ctx)
	stop, err := start(lctx)
	if err != nil {
		cancel()
		return sample{}, err
	}
	defer func() {
		cancel() // ends the load goroutines, which stop waits for
		stop()
	}()
	if err := sleepCtx(ctx, warmup); err != nil {
		return sample{}, err
	}
	a, err := m.snap(payload, h)
	if err != nil {
		return sample{}, err
	}
	h.active.Store(true)
	e0 := errs.Load()
	if err := sleepCtx(ctx, d); err != nil {
		return sample{}, err
	}
	h.active.Store(false)
	b, err := m.snap(payload, h)
	if err != nil {
		return sample{}, err
	}
	s := diff(a, b)
	s.lats = h.take()
	s.errs = errs.Load() - e0
	return s, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newClients makes n kgo clients bootstrapped at addr.
func newClients(addr string, n int, opts ...kgo.Opt) ([]*kgo.Client, error) {
	var cls []*kgo.Client
	for range n {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ClientID("kbench")}, opts...)...)
		if err != nil {
			closeAll(cls)
			return nil, fmt.Errorf("kgo client: %w", err)
		}
		cls = append(cls, cl)
	}
	return cls, nil
}

func closeAll(cls []*kgo.Client) {
	for _, cl := range cls {
		cl.Close()
	}
}

// produceSlice produces records of size bytes as fast as the clients
// go, through conns connections, and measures one window of d.
func produceSlice(ctx context.Context, o options, addr string, d time.Duration, m meter) (sample, error) {
	h := &e2eHook{key: 0}
	var acked, errs atomic.Int64
	return measure(ctx, d, m, h, &acked, &errs, produceLoad(o, addr, m, h, &acked, &errs))
}

// bothSlice produces and consumes at once on the same path, each with
// its own clients as in produceSlice and fetchSlice, and measures one
// window of d; the payload is what was acknowledged plus what was
// consumed, the latencies are the produces'.
func bothSlice(ctx context.Context, o options, addr string, d time.Duration, m meter) (sample, error) {
	h := &e2eHook{key: 0}
	var moved, errs atomic.Int64
	startP, startF := produceLoad(o, addr, m, h, &moved, &errs), fetchLoad(o, addr, m, h, &moved, &errs)
	return measure(ctx, d, m, h, &moved, &errs, func(ctx context.Context) (func(), error) {
		stopP, err := startP(ctx)
		if err != nil {
			return nil, err
		}
		stopF, err := startF(ctx)
		if err != nil {
			// measure cancels ctx when start fails, which ends the
			// produce load; its clients close once it has.
			go func() {
				<-ctx.Done()
				stopP()
			}()
			return nil, err
		}
		return func() { stopP(); stopF() }, nil
	})
}

// produceLoad returns the start function of produceSlice's load: acked
// counts the acknowledged payload, errs the clients' errors.
func produceLoad(o options, addr string, m meter, h *e2eHook, acked, errs *atomic.Int64) func(context.Context) (func(), error) {
	value := randomValue(o.recordSize)
	return func(ctx context.Context) (func(), error) {
		opts := []kgo.Opt{
			kgo.DefaultProduceTopic(produceTopic),
			kgo.ProducerBatchCompression(kgo.NoCompression()),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.WithHooks(h),
			kgo.MaxBufferedBytes(32 << 20),
			kgo.ProduceRequestTimeout(10 * time.Second),
			kgo.RecordDeliveryTimeout(20 * time.Second),
		}
		if o.batchMax > 0 {
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(o.batchMax)))
		}
		if o.linger > 0 {
			opts = append(opts, kgo.ProducerLinger(o.linger))
		}
		cls, err := newClients(addr, o.conns, m.clientOpts(opts...)...)
		if err != nil {
			return nil, err
		}
		done := func(r *kgo.Record, err error) {
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
					errs.Add(1)
				}
				return
			}
			acked.Add(int64(len(r.Value)))
		}
		var wg sync.WaitGroup
		for _, cl := range cls {
			wg.Go(func() {
				for ctx.Err() == nil {
					cl.Produce(ctx, &kgo.Record{Value: value}, done)
				}
			})
		}
		return func() {
			wg.Wait()
			closeAll(cls)
		}, nil
	}
}

// fetchSlice consumes the synthetic topic from the start as fast as the
// clients go and measures one window of d.
func fetchSlice(ctx context.Context, o options, addr string, d time.Duration, m meter) (sample, error) {
	h := &e2eHook{key: 1}
	var consumed, errs atomic.Int64
	return measure(ctx, d, m, h, &consumed, &errs, fetchLoad(o, addr, m, h, &consumed, &errs))
}

// fetchLoad returns the start function of fetchSlice's load: consumed
// counts the consumed payload, errs the clients' errors.
func fetchLoad(o options, addr string, m meter, h *e2eHook, consumed, errs *atomic.Int64) func(context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		cls, err := newClients(addr, o.conns, m.clientOpts(
			kgo.ConsumeTopics(fetchTopic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.WithHooks(h),
		)...)
		if err != nil {
			return nil, err
		}
		var wg sync.WaitGroup
		for _, cl := range cls {
			wg.Go(func() {
				for ctx.Err() == nil {
					fs := cl.PollFetches(ctx)
					fs.EachError(func(_ string, _ int32, err error) {
						if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
							errs.Add(1)
						}
					})
					var n int64
					fs.EachPartition(func(p kgo.FetchTopicPartition) {
						for _, r := range p.Records {
							n += int64(len(r.Value))
						}
					})
					consumed.Add(n)
				}
			})
		}
		return func() {
			wg.Wait()
			closeAll(cls)
		}, nil
	}
}

// latencyRun issues one request at a time at a fixed rate (a moderate
// load) for d and returns the end-to-end latency of each.
func latencyRun(ctx context.Context, o options, addr string, mode string, d time.Duration, m meter) ([]time.Duration, error) {
	key := int16(0)
	if mode == modeFetch {
		key = 1
	}
	h := &e2eHook{key: key}
	cl, err := kgo.NewClient(m.clientOpts(kgo.SeedBrokers(addr), kgo.ClientID("kbench-latency"), kgo.WithHooks(h),
		kgo.DefaultProduceTopic(produceTopic), kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.NoCompression()))...)
	if err != nil {
		return nil, fmt.Errorf("kgo client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()

	var issue func() error
	switch mode {
	case modeProduce:
		value := randomValue(o.recordSize)
		issue = func() error {
			return cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr()
		}
	case modeFetch:
		req, err := fetchRequest(ctx, cl)
		if err != nil {
			return nil, err
		}
		issue = func() error {
			kresp, err := cl.Request(ctx, req)
			if err != nil {
				return err
			}
			resp := kresp.(*kmsg.FetchResponse)
			if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
				return fmt.Errorf("fetch response with %d topics", len(resp.Topics))
			}
			p := resp.Topics[0].Partitions[0]
			if p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
				return fmt.Errorf("fetch: error code %d, %d batch bytes", p.ErrorCode, len(p.RecordBatches))
			}
			return nil
		}
	}
	// One request first, unmeasured: it dials and loads metadata.
	if err := issue(); err != nil {
		return nil, fmt.Errorf("%s latency warm-up via %s: %w", mode, addr, err)
	}
	h.active.Store(true)
	t := time.NewTicker(time.Second / time.Duration(o.latRate))
	defer t.Stop()
	end := time.After(d)
	for {
		select {
		case <-end:
			h.active.Store(false)
			return h.take(), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			if err := issue(); err != nil {
				return nil, fmt.Errorf("%s via %s: %w", mode, addr, err)
			}
		}
	}
}

// fetchRequest builds a fetch of one batch of partition 0 of the fetch
// topic, naming the topic both ways so any version encodes.
func fetchRequest(ctx context.Context, cl *kgo.Client) (*kmsg.FetchRequest, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(fetchTopic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	if len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		return nil, fmt.Errorf("metadata for %s: unexpected answer", fetchTopic)
	}
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis = 500
	req.MinBytes = 1
	req.MaxBytes = 50 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = fetchTopic
	ft.TopicID = mresp.Topics[0].TopicID
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition = 0
	fp.FetchOffset = 0
	fp.PartitionMaxBytes = 1 // the broker still returns one whole batch
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	return req, nil
}

// randomValue returns n incompressible bytes (from a fixed seed, so every
// run sends the same records).
func randomValue(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// percentile returns the q-quantile (0..1) of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func sortedCopy(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}
