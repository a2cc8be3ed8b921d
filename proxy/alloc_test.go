package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/kproxy/kproxy/codec"
)

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// fakeUpstream is a broker that answers ApiVersions and Metadata properly
// (so that the proxy's discovery works) and every other request with a
// fixed frame registered for its key and version, echoing the correlation
// id. Its per-request path does not allocate, so allocations measured
// while it serves belong to the proxy (or to the test's client).
type fakeUpstream struct {
	t    testing.TB
	ln   net.Listener
	addr string

	mu        sync.Mutex
	responses map[uint32][]byte // key<<16|version -> whole response frame; guarded by mu
	conns     []net.Conn        // guarded by mu
	wg        sync.WaitGroup
	served    atomic.Int64 // requests answered from responses
}

func startFakeUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fake upstream: %v", err)
	}
	u := &fakeUpstream{t: t, ln: ln, addr: ln.Addr().String(), responses: map[uint32][]byte{}}
	u.wg.Add(1)
	go u.accept()
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

// answer registers the response frame sent for requests of key at version.
func (u *fakeUpstream) answer(key, version int16, resp kmsg.Response) {
	resp.SetVersion(version)
	u.mu.Lock()
	u.responses[uint32(key)<<16|uint32(uint16(version))] = codec.AppendResponse(nil, 0, resp)
	u.mu.Unlock()
}

func (u *fakeUpstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns = append(u.conns, c)
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer c.Close()
			// A proxy closing its upstream connection mid-response
			// (its client went away) is no failure of the broker.
			if err := u.serve(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) &&
				!errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				u.t.Errorf("fake upstream: %v", err)
			}
		}()
	}
}

// serve answers the requests of one connection until it closes. Its
// buffers are owned by this goroutine.
func (u *fakeUpstream) serve(c net.Conn) error {
	in := make([]byte, 1<<20)
	out := make([]byte, 0, 1<<20)
	for {
		if _, err := io.ReadFull(c, in[:4]); err != nil {
			return err
		}
		size := int(binary.BigEndian.Uint32(in))
		if size < 8 || size > len(in)-4 {
			return fmt.Errorf("request of %d bytes", size)
		}
		if _, err := io.ReadFull(c, in[4:4+size]); err != nil {
			return err
		}
		key, version, corr := codec.FixedHeader(in[4:])
		var frame []byte
		switch key {
		case codec.KeyApiVersions:
			frame = u.apiVersions(corr, version)
		case codec.KeyMetadata:
			h, err := codec.ParseRequestHeader(in[4 : 4+size])
			if err != nil {
				return err
			}
			frame, err = u.metadata(corr, version, in[4+h.Len:4+size])
			if err != nil {
				return err
			}
		default:
			if key == codec.KeyProduce {
				h, err := codec.ParseRequestHeader(in[4 : 4+size])
				if err != nil {
					return err
				}
				if acks, ok := codec.ProduceAcks(in[4+h.Len:4+size], version); !ok || acks == 0 {
					continue
				}
			}
			u.mu.Lock()
			fixed, ok := u.responses[uint32(key)<<16|uint32(uint16(version))]
			u.mu.Unlock()
			if !ok {
				return fmt.Errorf("no response registered for %s v%d", kmsg.NameForKey(key), version)
			}
			u.served.Add(1)
			out = append(out[:0], fixed...)
			binary.BigEndian.PutUint32(out[4:], uint32(corr))
			frame = out
		}
		if _, err := c.Write(frame); err != nil {
			return err
		}
	}
}

func (u *fakeUpstream) apiVersions(corr int32, version int16) []byte {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(min(version, 3))
	for _, key := range []int16{codec.KeyProduce, codec.KeyFetch, codec.KeyMetadata, codec.KeyApiVersions} {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MaxVersion = key, codec.MaxVersion(key)
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	return codec.AppendResponse(nil, corr, resp)
}

// metadata answers with this one broker as node 0, so that the proxy opens
// a listener for it.
func (u *fakeUpstream) metadata(corr int32, version int16, body []byte) ([]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(version)
	if err := req.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("metadata request: %w", err)
	}
	host, port, _ := net.SplitHostPort(u.addr)
	var p int32
	fmt.Sscan(port, &p)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = 0, host, p
	resp.Brokers = append(resp.Brokers, b)
	resp.ControllerID = 0
	return codec.AppendResponse(nil, corr, resp), nil
}

// rawConn is a client speaking raw frames to the proxy, with buffers
// preallocated so that a round trip does not allocate on the client side.
type rawConn struct {
	c   net.Conn
	buf []byte
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, buf: make([]byte, 1<<20)}
}

// roundTrip writes frames (n requests, each expecting a response) and
// reads n responses, checking only their framing.
func (r *rawConn) roundTrip(frames []byte, n int) error {
	if err := r.c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := r.c.Write(frames); err != nil {
		return err
	}
	for range n {
		if _, err := io.ReadFull(r.c, r.buf[:4]); err != nil {
			return err
		}
		size := int(binary.BigEndian.Uint32(r.buf))
		if size < 4 || size > len(r.buf) {
			return errBadFrame
		}
		if _, err := io.ReadFull(r.c, r.buf[:size]); err != nil {
			return err
		}
	}
	return nil
}

var errBadFrame = errors.New("response frame of a bad size")

// allocCase is one kind of forwarded request and the allocations its
// round trip through one session may cost.
type allocCase struct {
	name      string
	req       kmsg.Request // request to send, version set
	acks0     bool         // a Produce with acks=0: no response; a Fetch follows to sync
	resp      kmsg.Response
	pipelined int // requests written at once; 1 means one at a time
	// maxAllocs is the ceiling per request. Zero is the goal for every
	// forwarded request; a non-zero value documents a known cost (see
	// the comment at the case).
	maxAllocs float64
}

func produceReq(version int16, acks int16, recordBytes int) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(version)
	req.Acks = acks
	req.TimeoutMillis = 1000
	t := kmsg.NewProduceRequestTopic()
	t.Topic = "alloc"
	p := kmsg.NewProduceRequestTopicPartition()
	p.Records = make([]byte, recordBytes) // opaque to the proxy
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	return req
}

func produceResp() *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	t := kmsg.NewProduceResponseTopic()
	t.Topic = "alloc"
	t.Partitions = append(t.Partitions, kmsg.NewProduceResponseTopicPartition())
	resp.Topics = append(resp.Topics, t)
	return resp
}

func fetchReq(version int16) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.SetVersion(version)
	t := kmsg.NewFetchRequestTopic()
	t.Topic = "alloc"
	t.Partitions = append(t.Partitions, kmsg.NewFetchRequestTopicPartition())
	req.Topics = append(req.Topics, t)
	return req
}

func fetchResp(batchBytes int) *kmsg.FetchResponse {
	resp := kmsg.NewPtrFetchResponse()
	t := kmsg.NewFetchResponseTopic()
	t.Topic = "alloc"
	p := kmsg.NewFetchResponseTopicPartition()
	p.RecordBatches = make([]byte, batchBytes) // opaque to the proxy
	t.Partitions = append(t.Partitions, p)
	resp.Topics = append(resp.Topics, t)
	return resp
}

// TestForwardAllocs locks in the allocations per forwarded request
// through one session: small frames (copied through the buffers), large
// ones (spliced), pipelined ones, acks=0, with metrics off and with the
// OpenTelemetry SDK recording them.
func TestForwardAllocs(t *testing.T) {
	cases := []allocCase{
		{name: "fetch-v11-small", req: fetchReq(11), resp: fetchResp(1 << 10), pipelined: 1},
		{name: "fetch-v11-small-pipelined", req: fetchReq(11), resp: fetchResp(1 << 10), pipelined: 16},
		{name: "fetch-v15-small", req: fetchReq(15), resp: fetchResp(1 << 10), pipelined: 1},
		// A 256 KiB response moves by splice after its first buffer,
		// through the session's own io.LimitedReader (a local one would
		// escape through TCPConn.ReadFrom's io.Reader parameter).
		{name: "fetch-v12-256KiB", req: fetchReq(12), resp: fetchResp(256 << 10), pipelined: 1},
		// 64 pipelined 3 KB responses stream through the 64 KiB buffer,
		// so some frames straddle a buffer fill: pipe copies their
		// remainder with Peek/Write/Discard, not io.CopyN (whose
		// LimitReader escapes, and whose bufio.Writer.ReadFrom path
		// allocates a copy buffer in TCPConn.ReadFrom).
		{name: "fetch-v13-3KB-pipelined-64", req: fetchReq(13), resp: fetchResp(3000), pipelined: 64},
		{name: "produce-v9-small", req: produceReq(9, 1, 1<<10), resp: produceResp(), pipelined: 1},
		{name: "produce-v9-small-pipelined", req: produceReq(9, 1, 1<<10), resp: produceResp(), pipelined: 16},
		{name: "produce-v9-256KiB", req: produceReq(9, 1, 256<<10), resp: produceResp(), pipelined: 1},
		{name: "produce-v9-acks0", req: produceReq(9, 0, 1<<10), acks0: true, resp: produceResp(), pipelined: 1},
	}
	// Produce v10+ responses are scanned for KIP-951 leader endpoints
	// without decoding (codec.ProduceHasEndpoints); only a response that
	// carries them is decoded and rewritten.
	if codec.MaxVersion(codec.KeyProduce) >= 10 {
		cases = append(cases, allocCase{name: "produce-v10-rewrite-scan", req: produceReq(10, 1, 1<<10), resp: produceResp(), pipelined: 1})
	}

	for _, metrics := range []string{"noop", "sdk"} {
		t.Run("metrics="+metrics, func(t *testing.T) {
			up := startFakeUpstream(t)
			for _, c := range cases {
				up.answer(c.req.Key(), c.req.GetVersion(), c.resp)
			}
			up.answer(codec.KeyFetch, 11, fetchResp(1<<10))
			p := startProxy(t, []string{up.addr}, func(cfg *Config) {
				cfg.MetadataInterval = time.Hour
				if metrics == "sdk" {
					mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
					t.Cleanup(func() { mp.Shutdown(t.Context()) })
					cfg.MeterProvider = mp
				}
			})
			rc := dialRaw(t, p.Addr())
			f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("alloc-test"))
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					// AppendRequest writes the size at dst[0], so each
					// frame is built on its own and then appended.
					var frames []byte
					for i := range c.pipelined {
						frames = append(frames, f.AppendRequest(nil, c.req, int32(i))...)
					}
					expect := c.pipelined
					if c.acks0 {
						frames = append(frames, f.AppendRequest(nil, fetchReq(11), 99)...)
						expect = 1
					}
					// One run is perRun round trips: AllocsPerRun
					// truncates its average to an integer, so this makes
					// its resolution 1/perRun allocation per round trip.
					const perRun = 10
					var rtErr error
					run := func() {
						for range perRun {
							if err := rc.roundTrip(frames, expect); err != nil && rtErr == nil {
								rtErr = err
							}
						}
					}
					for range 5 { // warm up: buffers, dial, metrics' first record
						run()
					}
					if rtErr != nil {
						t.Fatalf("round trip through the proxy: %v", rtErr)
					}
					allocs := testing.AllocsPerRun(100, run) / float64(perRun*c.pipelined)
					if rtErr != nil {
						t.Fatalf("round trip through the proxy: %v", rtErr)
					}
					t.Logf("%.2f allocations per forwarded request", allocs)
					if raceEnabled() {
						// The race detector's instrumentation allocates;
						// the round trips above still ran under it.
						t.Logf("-race: allocation ceiling %v not checked", c.maxAllocs)
						return
					}
					if allocs > c.maxAllocs {
						t.Errorf("%.2f allocations per forwarded request, want <= %v; find them with go test -run TestForwardAllocs -memprofile mem.out -memprofilerate 1 ./proxy && go tool pprof -sample_index=alloc_objects -list 'proxy\\.' mem.out", allocs, c.maxAllocs)
					}
				})
			}
		})
	}
}
