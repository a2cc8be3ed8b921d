package main

// The conns mode: many client connections at once, most of them idle.
//
// A few hundred active clients produce and fetch, one request at a time
// each, through kproxy; the rest of the connections are idle clients that
// did what a client does on connecting (ApiVersions, Metadata) and then
// send one small request (ApiVersions) every --conns-heartbeat. The
// active load is measured three times in one run: before the idle
// connections open, with them open, and after they close; the figures
// with idle connections are given as ratios to the mean of the two
// without. Every client is a raw connection speaking frames built by kmsg
// (a franz-go client per connection would weigh more than kproxy).
// Clients dial from several loopback addresses (127.0.0.2, .3, ...) so
// that neither kproxy's per-host limit nor one address's ephemeral ports
// bound the count.

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const modeConns = "conns"

// connsOptions are the conns mode's settings.
type connsOptions struct {
	total     int           // client connections, active ones included
	active    int           // of which producing and fetching
	heartbeat time.Duration // an idle connection's request interval
	phase     time.Duration // measured time of each of the three phases
	perIP     int           // connections dialled from one loopback address
}

func addConnsFlags(fs *flag.FlagSet, o *connsOptions) {
	fs.IntVar(&o.total, "conns-total", 10000, "conns mode: client connections in all, active ones included")
	fs.IntVar(&o.active, "conns-active", 300, "conns mode: connections producing and fetching (half each), one request at a time")
	fs.DurationVar(&o.heartbeat, "conns-heartbeat", 5*time.Second, "conns mode: interval of each idle connection's small request (ApiVersions); 0: quiet after connecting")
	fs.DurationVar(&o.phase, "conns-phase", 10*time.Second, "conns mode: measured time of each phase (without, with, and again without the idle connections)")
	fs.IntVar(&o.perIP, "conns-per-ip", 4000, "conns mode: connections dialled from each loopback source address (127.0.0.2, .3, ...)")
}

func (o connsOptions) validate() error {
	if o.active < 1 || o.total < o.active || o.total > 200000 {
		return errors.New("--conns-active must be positive and at most --conns-total (<= 200000)")
	}
	if (o.heartbeat != 0 && o.heartbeat < 100*time.Millisecond) || o.phase < time.Second || o.phase > time.Hour || o.perIP < 1 || o.perIP > 20000 {
		return errors.New("--conns-heartbeat must be 0 or >= 100ms, --conns-phase in [1s, 1h], --conns-per-ip in [1, 20000]")
	}
	return nil
}

// timeLimit bounds a conns run: three phases with warm-ups, opening and
// closing the idle connections, builds and startup.
func (o connsOptions) timeLimit() time.Duration {
	return 3*(o.phase+2*warmup) + 7*time.Minute + time.Duration(o.total)*10*time.Millisecond
}

// connsResult is the outcome of the conns mode.
type connsResult struct {
	Total        int         `json:"total_conns"`
	Active       int         `json:"active_conns"`
	Idle         int         `json:"idle_conns"`
	HeartbeatSec float64     `json:"heartbeat_interval_s"`
	Before       connsSample `json:"without_idle_before"`
	WithIdle     connsSample `json:"with_idle"`
	After        connsSample `json:"without_idle_after"`
	// Ratios of the phase with idle connections to the mean of the two
	// without.
	ThroughputRatio float64 `json:"throughput_ratio"`
	P99Ratio        float64 `json:"p99_ratio"`
	RSSRatio        float64 `json:"rss_ratio"`
	// RSSPerIdleKiB is kproxy's RSS growth from the first phase to the
	// second per idle connection.
	RSSPerIdleKiB float64 `json:"rss_per_idle_conn_kib"`
	// Idle connections' heartbeats during the phase with them.
	HeartbeatN     int64   `json:"heartbeats"`
	HeartbeatP99Ms float64 `json:"heartbeat_p99_ms"`
	IdleErrors     int64   `json:"idle_errors"`
	OpenSec        float64 `json:"idle_open_s"`
	FileLimit      uint64  `json:"open_file_limit"`
	CappedFrom     int     `json:"capped_from,omitempty"` // --conns-total, when the file limit allowed fewer
}

// connsSample is one phase's active load and kproxy's state.
type connsSample struct {
	Requests   int64   `json:"requests"`
	ReqPerSec  float64 `json:"req_per_s"`
	WireMBps   float64 `json:"wire_mb_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	Errors     int64   `json:"errors"`
	RSSMB      float64 `json:"kproxy_rss_mb"`
	CPUSec     float64 `json:"kproxy_cpu_s"`
	ProxyConns int     `json:"kproxy_fds"`
}

// runConns runs the conns mode against its own cluster and kproxy child.
func runConns(ctx context.Context, o options, bin, tmp string) (*connsResult, error) {
	co := o.connsOpts
	// kproxy holds two descriptors per connection (client and
	// upstream): the open-file limit it inherits from this process
	// bounds the run. The idle clients run in a worker process of their
	// own so that this one (the in-memory broker holds the far end of
	// every upstream connection) stays within the same limit.
	limit := raiseNofile(uint64(2*co.total + fdSpare))
	res := &connsResult{FileLimit: limit}
	if fit := int(max(int64(limit)-fdSpare, 0) / 2); co.total > fit {
		slog.Warn("the open-file limit caps the connections: kproxy takes two descriptors per connection (raise ulimit -Hn for more)",
			"open_file_limit", limit, "asked", co.total, "running", fit)
		res.CappedFrom = co.total
		co.total = fit
		if co.total <= co.active {
			return nil, fmt.Errorf("the open-file limit %d leaves room for %d connections, not more than the %d active ones", limit, fit, co.active)
		}
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.BlackholeProduce(),
		kfake.SyntheticFetch(kfake.SyntheticBatch{RecordBytes: o.recordSize, Records: max(1, o.batchBytes/o.recordSize)}),
		kfake.SeedTopics(int32(o.partitions), produceTopic, fetchTopic))
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	ch, err := startChild(ctx, bin, cluster.ListenAddrs()[0], tmp, o.verbose)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := ch.stop(); err != nil {
			slog.Warn("stopping kproxy", "err", err)
		}
	}()

	// One bootstrap connection finds the broker's kproxy listener, as a
	// client does.
	boot, err := dialRaw(ctx, ch.addr, nil)
	if err != nil {
		return nil, err
	}
	md, err := boot.handshake(produceTopic, fetchTopic)
	boot.c.Close()
	if err != nil {
		return nil, fmt.Errorf("metadata through kproxy: %w", err)
	}
	if len(md.Brokers) != 1 {
		return nil, fmt.Errorf("kproxy's metadata lists %d brokers, want 1", len(md.Brokers))
	}
	broker := net.JoinHostPort(md.Brokers[0].Host, strconv.Itoa(int(md.Brokers[0].Port)))
	slog.Info("conns mode", "kproxy", ch.addr, "broker_listener", broker, "total", co.total, "active", co.active, "open_file_limit", limit)

	produce := produceFrame(o.recordSize, max(1, o.batchBytes/o.recordSize))
	act := &activeLoad{}
	actx, stopActive := context.WithCancel(ctx)
	var awg sync.WaitGroup
	defer func() { stopActive(); awg.Wait() }()
	for i := range co.active {
		c, err := dialRaw(ctx, broker, sourceAddr(i, co.perIP))
		if err != nil {
			return nil, fmt.Errorf("active client %d: %w", i, err)
		}
		if _, err := c.handshake(produceTopic, fetchTopic); err != nil {
			c.c.Close()
			return nil, fmt.Errorf("active client %d: %w", i, err)
		}
		awg.Go(func() {
			defer c.c.Close()
			act.run(actx, c, i%2 == 0, produce, int32(i%o.partitions))
		})
	}

	res.Total, res.Active, res.Idle, res.HeartbeatSec = co.total, co.active, co.total-co.active, co.heartbeat.Seconds()
	if res.Before, err = act.measure(ctx, co.phase, ch); err != nil {
		return nil, err
	}
	slog.Info("phase", "idle", 0, "req/s", fmt.Sprintf("%.0f", res.Before.ReqPerSec), "p99_ms", fmt.Sprintf("%.2f", res.Before.P99Ms), "rss_mb", fmt.Sprintf("%.1f", res.Before.RSSMB))

	openStart := time.Now()
	w, err := startIdleWorker(ctx, broker, co)
	if err != nil {
		return nil, fmt.Errorf("opening idle connections: %w (kproxy log: %s)", err, ch.logPath)
	}
	res.OpenSec = time.Since(openStart).Seconds()
	slog.Info("idle connections open", "n", res.Idle, "seconds", fmt.Sprintf("%.1f", res.OpenSec))
	if _, err := w.take(); err != nil { // heartbeats while opening are not measured
		w.stop()
		return nil, err
	}
	if res.WithIdle, err = act.measure(ctx, co.phase, ch); err != nil {
		w.stop()
		return nil, err
	}
	hb, err := w.take()
	w.stop()
	if err != nil {
		return nil, err
	}
	res.HeartbeatN, res.HeartbeatP99Ms, res.IdleErrors = hb.N, hb.P99Ms, hb.Errors
	slog.Info("phase", "idle", res.Idle, "req/s", fmt.Sprintf("%.0f", res.WithIdle.ReqPerSec), "p99_ms", fmt.Sprintf("%.2f", res.WithIdle.P99Ms), "rss_mb", fmt.Sprintf("%.1f", res.WithIdle.RSSMB))
	if err := sleepCtx(ctx, 2*time.Second); err != nil { // kproxy closes the sessions
		return nil, err
	}
	if res.After, err = act.measure(ctx, co.phase, ch); err != nil {
		return nil, err
	}
	slog.Info("phase", "idle", "closed", "req/s", fmt.Sprintf("%.0f", res.After.ReqPerSec), "p99_ms", fmt.Sprintf("%.2f", res.After.P99Ms), "rss_mb", fmt.Sprintf("%.1f", res.After.RSSMB))
	select {
	case <-ch.exited:
		return nil, fmt.Errorf("kproxy exited during the run (%v); its log: %s", ch.waitErr, ch.logPath)
	default:
	}
	res.ratios()
	return res, nil
}

func (r *connsResult) ratios() {
	mean := func(a, b float64) float64 { return (a + b) / 2 }
	if m := mean(r.Before.ReqPerSec, r.After.ReqPerSec); m > 0 {
		r.ThroughputRatio = r.WithIdle.ReqPerSec / m
	}
	if m := mean(r.Before.P99Ms, r.After.P99Ms); m > 0 {
		r.P99Ratio = r.WithIdle.P99Ms / m
	}
	if r.Before.RSSMB > 0 {
		r.RSSRatio = r.WithIdle.RSSMB / r.Before.RSSMB
	}
	if r.Idle > 0 {
		r.RSSPerIdleKiB = (r.WithIdle.RSSMB - r.Before.RSSMB) * 1e6 / 1024 / float64(r.Idle)
	}
}

// print writes the conns mode's table.
func (r *connsResult) print(w io.Writer) {
	hb := "quiet"
	if r.HeartbeatSec > 0 {
		hb = fmt.Sprintf("ApiVersions every %gs", r.HeartbeatSec)
	}
	fmt.Fprintf(w, "conns: %d connections, %d active (produce+fetch, one request at a time each), %d idle (%s); open-file limit %d\n",
		r.Total, r.Active, r.Idle, hb, r.FileLimit)
	if r.CappedFrom > 0 {
		fmt.Fprintf(w, "(%d connections asked: the open-file limit allows kproxy, at two descriptors each, %d)\n", r.CappedFrom, r.Total)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\treq/s\twire MB/s\tp50 ms\tp99 ms\terrors\tkproxy RSS MB\tkproxy fds\tkproxy CPU s\t")
	for _, p := range []struct {
		name string
		s    connsSample
	}{{"without idle", r.Before}, {fmt.Sprintf("with %d idle", r.Idle), r.WithIdle}, {"without idle again", r.After}} {
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.3f\t%.3f\t%d\t%.1f\t%d\t%.2f\t\n", p.name, p.s.ReqPerSec, p.s.WireMBps, p.s.P50Ms, p.s.P99Ms, p.s.Errors, p.s.RSSMB, p.s.ProxyConns, p.s.CPUSec)
	}
	tw.Flush()
	fmt.Fprintf(w, "with/without idle: throughput %.2fx, p99 %.2fx, kproxy RSS %.2fx (%.1f KiB per idle connection); idle heartbeats %d, p99 %.3f ms, %d errors; idle connections opened in %.1fs\n",
		r.ThroughputRatio, r.P99Ratio, r.RSSRatio, r.RSSPerIdleKiB, r.HeartbeatN, r.HeartbeatP99Ms, r.IdleErrors, r.OpenSec)
}

// fdSpare is the descriptors kept beside the connections, in kproxy and
// here: listeners, the discovery client, logs, pipes.
const fdSpare = 64

// raiseNofile raises this process's open-file limit towards want (the
// hard limit too, when privileged; else to the hard limit) and returns
// the soft limit it got. Children inherit it.
func raiseNofile(want uint64) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		slog.Warn("cannot read the open-file limit", "err", err)
		return 0
	}
	if uint64(lim.Cur) >= want {
		return uint64(lim.Cur)
	}
	raised := lim
	raised.Cur, raised.Max = max(raised.Cur, want), max(raised.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
		return uint64(raised.Cur)
	}
	raised.Cur, raised.Max = lim.Max, lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		slog.Warn("cannot raise the open-file limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
		return uint64(lim.Cur)
	}
	return uint64(raised.Cur)
}

// sourceAddr is the loopback address connection i dials from.
func sourceAddr(i, perIP int) *net.TCPAddr {
	n := 2 + i/perIP
	return &net.TCPAddr{IP: net.IPv4(127, byte(n>>16), byte(n>>8), byte(n))}
}

// rawConn is one client connection speaking kmsg frames, one request at a
// time. Owned by one goroutine.
type rawConn struct {
	c    net.Conn
	f    *kmsg.RequestFormatter
	corr int32
	out  []byte
	in   []byte
}

func dialRaw(ctx context.Context, addr string, from *net.TCPAddr) (*rawConn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if from != nil {
		d.LocalAddr = from
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &rawConn{c: c, f: kmsg.NewRequestFormatter(kmsg.FormatterClientID("kbench-conns"))}, nil
}

// frame encodes req into the connection's output buffer.
func (r *rawConn) frame(req kmsg.Request) []byte {
	r.corr++
	r.out = r.f.AppendRequest(r.out[:0], req, r.corr)
	return r.out
}

// do writes frame (a whole request with the connection's current
// correlation id) and reads its response, decoding it into resp. It
// returns the bytes moved.
func (r *rawConn) do(frame []byte, resp kmsg.Response) (int, error) {
	r.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.c.Write(frame); err != nil {
		return 0, err
	}
	var size [4]byte
	if _, err := io.ReadFull(r.c, size[:]); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > 64<<20 {
		return 0, fmt.Errorf("response frame of %d bytes", n)
	}
	if cap(r.in) < n {
		r.in = make([]byte, n)
	}
	b := r.in[:n]
	if _, err := io.ReadFull(r.c, b); err != nil {
		return 0, err
	}
	if corr := int32(binary.BigEndian.Uint32(b)); corr != r.corr {
		return 0, fmt.Errorf("response to correlation id %d, want %d", corr, r.corr)
	}
	body := b[4:]
	if resp.IsFlexible() && resp.Key() != int16(kmsg.ApiVersions) { // ApiVersions keeps response header v0 (KIP-511)
		if len(body) == 0 || body[0] != 0 {
			return 0, errors.New("unexpected response header tags")
		}
		body = body[1:]
	}
	if err := resp.ReadFrom(body); err != nil {
		return 0, fmt.Errorf("%s response: %w", kmsg.NameForKey(resp.Key()), err)
	}
	return len(frame) + 4 + n, nil
}

func (r *rawConn) roundTrip(req kmsg.Request) (kmsg.Response, error) {
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	_, err := r.do(r.frame(req), resp)
	return resp, err
}

// apiVersionsReq is the first request of every connection, and the idle
// connections' heartbeat.
func apiVersionsReq() *kmsg.ApiVersionsRequest {
	av := kmsg.NewPtrApiVersionsRequest()
	av.SetVersion(3)
	av.ClientSoftwareName, av.ClientSoftwareVersion = "kbench", "1"
	return av
}

// handshake does what a client does on connecting: ApiVersions, then
// Metadata for topics.
func (r *rawConn) handshake(topics ...string) (*kmsg.MetadataResponse, error) {
	resp, err := r.roundTrip(apiVersionsReq())
	if err != nil {
		return nil, err
	}
	if code := resp.(*kmsg.ApiVersionsResponse).ErrorCode; code != 0 {
		return nil, fmt.Errorf("ApiVersions error %d", code)
	}
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(12)
	for _, t := range topics {
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = kmsg.StringPtr(t)
		md.Topics = append(md.Topics, mt)
	}
	mresp, err := r.roundTrip(md)
	if err != nil {
		return nil, err
	}
	return mresp.(*kmsg.MetadataResponse), nil
}

// produceFrame builds a v2 record batch of n records of size bytes each,
// with its CRC (the broker checks it).
func produceFrame(size, n int) []byte {
	value := randomValue(size)
	var records []byte
	for i := range n {
		rec := kmsg.Record{OffsetDelta: int32(i), Value: value}
		body := rec.AppendTo(nil)[1:] // with Length 0: its varint is one byte
		rec.Length = int32(len(body))
		records = rec.AppendTo(records)
	}
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{
		Magic: 2, LastOffsetDelta: int32(n - 1), FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(n), Records: records,
		Length: int32(49 + len(records)),
	}
	enc := b.AppendTo(nil)
	// The CRC (Castagnoli) covers what follows it, from byte 21.
	crc := crc32.Checksum(enc[21:], crc32.MakeTable(crc32.Castagnoli))
	binary.BigEndian.PutUint32(enc[17:], crc)
	return enc
}

// activeLoad is the producing and fetching clients' shared counters.
type activeLoad struct {
	measuring atomic.Bool
	reqs      atomic.Int64
	wire      atomic.Int64
	errs      atomic.Int64

	mu   sync.Mutex
	lats []time.Duration // guarded by mu; while measuring
}

// run drives one active client until ctx ends: produce (acks=1) of the
// batch, or fetch of one batch of partition part.
func (a *activeLoad) run(ctx context.Context, c *rawConn, producer bool, batch []byte, part int32) {
	var req kmsg.Request
	if producer {
		p := kmsg.NewPtrProduceRequest()
		p.SetVersion(9)
		p.Acks, p.TimeoutMillis = 1, 10000
		t := kmsg.NewProduceRequestTopic()
		t.Topic = produceTopic
		pp := kmsg.NewProduceRequestTopicPartition()
		pp.Partition, pp.Records = part, batch
		t.Partitions = append(t.Partitions, pp)
		p.Topics = append(p.Topics, t)
		req = p
	} else {
		f := kmsg.NewPtrFetchRequest()
		f.SetVersion(12)
		f.ReplicaID, f.MaxWaitMillis, f.MinBytes, f.MaxBytes = -1, 500, 1, 50<<20
		t := kmsg.NewFetchRequestTopic()
		t.Topic = fetchTopic
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.PartitionMaxBytes = part, 1 // the broker still returns one whole batch
		t.Partitions = append(t.Partitions, fp)
		f.Topics = append(f.Topics, t)
		req = f
	}
	for ctx.Err() == nil {
		resp := req.ResponseKind()
		resp.SetVersion(req.GetVersion())
		frame := c.frame(req)
		start := time.Now()
		n, err := c.do(frame, resp)
		d := time.Since(start)
		if err == nil {
			err = responseError(resp)
		}
		if err != nil {
			if ctx.Err() == nil {
				a.errs.Add(1)
				slog.Warn("active client", "err", err)
				sleepCtx(ctx, 100*time.Millisecond)
			}
			continue
		}
		a.reqs.Add(1)
		a.wire.Add(int64(n))
		a.mu.Lock()
		if a.measuring.Load() {
			a.lats = append(a.lats, d)
		}
		a.mu.Unlock()
	}
}

// responseError is the first partition error in a produce or fetch
// response.
func responseError(resp kmsg.Response) error {
	switch r := resp.(type) {
	case *kmsg.ProduceResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					return fmt.Errorf("produce: error code %d", p.ErrorCode)
				}
			}
		}
	case *kmsg.FetchResponse:
		if r.ErrorCode != 0 {
			return fmt.Errorf("fetch: error code %d", r.ErrorCode)
		}
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
					return fmt.Errorf("fetch: error code %d, %d batch bytes", p.ErrorCode, len(p.RecordBatches))
				}
			}
		}
	}
	return nil
}

// measure runs one phase: a warm-up, then d measured, sampling kproxy's
// RSS at the end.
func (a *activeLoad) measure(ctx context.Context, d time.Duration, ch *child) (connsSample, error) {
	if err := sleepCtx(ctx, warmup); err != nil {
		return connsSample{}, err
	}
	cpu0, err := ch.cpu()
	if err != nil {
		return connsSample{}, err
	}
	r0, w0, e0 := a.reqs.Load(), a.wire.Load(), a.errs.Load()
	start := time.Now()
	a.measuring.Store(true)
	if err := sleepCtx(ctx, d); err != nil {
		return connsSample{}, err
	}
	a.measuring.Store(false)
	el := time.Since(start)
	a.mu.Lock()
	lats := sortedCopy(a.lats)
	a.lats = nil
	a.mu.Unlock()
	cpu1, err := ch.cpu()
	if err != nil {
		return connsSample{}, err
	}
	s := connsSample{
		Requests: a.reqs.Load() - r0,
		Errors:   a.errs.Load() - e0,
		P50Ms:    ms(percentile(lats, 0.50)),
		P99Ms:    ms(percentile(lats, 0.99)),
		CPUSec:   (cpu1 - cpu0).Seconds(),
	}
	s.ReqPerSec = float64(s.Requests) / el.Seconds()
	s.WireMBps = mbps(a.wire.Load()-w0, el)
	s.RSSMB, s.ProxyConns = procRSS(ch.cmd.Process.Pid)
	return s, nil
}

// procRSS returns pid's resident set in MB (1e6 bytes) and its open
// descriptors.
func procRSS(pid int) (float64, int) {
	var rss float64
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
				rss = kb * 1024 / 1e6
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return rss, len(fds)
}

// idleLoad is the idle connections: each sends ApiVersions every
// interval (never when it is 0), from a random phase.
type idleLoad struct {
	every time.Duration
	wg    sync.WaitGroup
	errs  atomic.Int64

	mu   sync.Mutex
	lats []time.Duration // guarded by mu
}

// open dials connections [from, to) with a few dozen dialers at a time,
// each doing the client handshake, and starts their heartbeats; it
// returns once all are open. The connections close when ctx ends.
func (l *idleLoad) open(ctx context.Context, addr string, from, to, perIP int) error {
	var next atomic.Int64
	next.Store(int64(from))
	var failed atomic.Pointer[error]
	var dialers sync.WaitGroup
	progress := time.AfterFunc(5*time.Second, func() {})
	progress.Stop()
	var report func()
	report = func() {
		slog.Info("opening idle connections", "opened", int(next.Load())-from, "of", to-from)
		progress = time.AfterFunc(5*time.Second, report)
	}
	progress = time.AfterFunc(5*time.Second, report)
	defer func() { progress.Stop() }()
	for range 32 {
		dialers.Go(func() {
			for ctx.Err() == nil && failed.Load() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				c, err := dialRaw(ctx, addr, sourceAddr(i, perIP))
				if err == nil {
					if _, err = c.handshake(); err != nil {
						c.c.Close()
					}
				}
				if err != nil {
					err = fmt.Errorf("connection %d: %w", i, err)
					failed.CompareAndSwap(nil, &err)
					return
				}
				c.in, c.out = nil, nil // heartbeats are small; keep this process small too
				l.wg.Go(func() { l.heartbeat(ctx, c) })
			}
		})
	}
	dialers.Wait()
	if p := failed.Load(); p != nil {
		return *p
	}
	return ctx.Err()
}

func (l *idleLoad) heartbeat(ctx context.Context, c *rawConn) {
	defer c.c.Close()
	if l.every == 0 {
		<-ctx.Done()
		return
	}
	req := apiVersionsReq()
	t := time.NewTimer(rand.N(l.every))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(l.every)
		resp := req.ResponseKind()
		resp.SetVersion(req.GetVersion())
		start := time.Now()
		if _, err := c.do(c.frame(req), resp); err != nil {
			if ctx.Err() == nil {
				l.errs.Add(1)
				slog.Warn("idle connection", "err", err)
			}
			return
		}
		d := time.Since(start)
		l.mu.Lock()
		l.lats = append(l.lats, d)
		l.mu.Unlock()
	}
}

// take returns and clears the heartbeat latencies so far.
func (l *idleLoad) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.lats
	l.lats = nil
	return d
}
