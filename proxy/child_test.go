//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kproxy/kproxy/codec"
)

// The memory tests measure a proxy running alone in a child process (this
// test binary, re-executed with childEnv set), so that the heap they read
// holds the proxy and nothing else: the broker and the clients run in the
// test process.
const (
	childEnv         = "KPROXY_TEST_CHILD"
	childUpstreamEnv = "KPROXY_TEST_CHILD_UPSTREAM"
	childTLSEnv      = "KPROXY_TEST_CHILD_TLS"    // "certfile,keyfile": TLS listeners
	childLogEnv      = "KPROXY_TEST_CHILD_LOG"    // "debug" or "warn": log to stderr at that level
	childNofileEnv   = "KPROXY_TEST_CHILD_NOFILE" // n: once started, lower the open-file limit to n more than are open
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "proxy" {
		os.Exit(childProxyMain())
	}
	os.Exit(m.Run())
}

// childMem is what the child reports of its memory after collecting.
type childMem struct {
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Goroutines int    `json:"goroutines"`
	Sessions   int    `json:"sessions"`
	// AcceptFDErrors is kproxy.accept.errors{reason=file_descriptors}.
	AcceptFDErrors int64 `json:"accept_fd_errors"`
}

// childProxyMain runs a proxy in front of the upstream named in the
// environment, prints its bootstrap address, and answers each line
// "mem" on stdin with its memory (childMem as JSON) until stdin closes.
func childProxyMain() int {
	cfg := Config{
		Upstreams:        []string{os.Getenv(childUpstreamEnv)},
		Listen:           "127.0.0.1:0",
		MetadataInterval: time.Hour,
	}
	switch os.Getenv(childLogEnv) {
	case "debug":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	case "warn":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	reader := sdkmetric.NewManualReader()
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	if files := os.Getenv(childTLSEnv); files != "" {
		cert, key, _ := strings.Cut(files, ",")
		src, err := NewTLSSource(TLSConfig{CertFile: cert, KeyFile: key}, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child tls:", err)
			return 1
		}
		cfg.TLS = src
	}
	p, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child proxy:", err)
		return 1
	}
	if err := p.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		return 1
	}
	if extra := os.Getenv(childNofileEnv); extra != "" {
		n, _ := strconv.Atoi(extra)
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			fmt.Fprintln(os.Stderr, "child fds:", err)
			return 1
		}
		var lim syscall.Rlimit
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
		lim.Cur = uint64(len(fds) + n)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			fmt.Fprintln(os.Stderr, "child rlimit:", err)
			return 1
		}
	}
	fmt.Printf("addr %s\n", p.Addr())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "mem" {
			continue
		}
		// Each collection halves the stacks that use under a quarter
		// of their size, and sync.Pool drops what stayed unused across
		// two; several bring both to their floor.
		for range 6 {
			runtime.GC()
		}
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		p.mu.Lock()
		n := len(p.sessions)
		p.mu.Unlock()
		b, _ := json.Marshal(childMem{HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, Goroutines: runtime.NumGoroutine(), Sessions: n,
			AcceptFDErrors: acceptFDErrors(reader)})
		fmt.Printf("mem %s\n", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.Shutdown(ctx)
	return 0
}

// acceptFDErrors reads kproxy.accept.errors{reason=file_descriptors}.
func acceptFDErrors(r *sdkmetric.ManualReader) int64 {
	return counterByReason(r, "kproxy.accept.errors", "file_descriptors")
}

// counterByReason reads the int64 counter name{reason=reason}; -1 when
// collecting fails.
func counterByReason(r *sdkmetric.ManualReader, name, reason string) int64 {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, _ := dp.Attributes.Value("reason"); v.AsString() == reason {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// proxyChild is a proxy running in a child process.
type proxyChild struct {
	pid    int
	stderr *lockedBuffer // the child's log, also copied to the test's stderr under -v
	addr   string
	in     io.WriteCloser
	lines  chan string // the child's stdout, line by line
}

// startProxyChild starts a proxy child in front of upstream; env adds to
// its environment. The test stops it.
func startProxyChild(t testing.TB, upstream string, env ...string) *proxyChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=proxy", childUpstreamEnv + "=" + upstream}, env...)...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if testing.Verbose() {
		cmd.Stderr = io.MultiWriter(stderr, os.Stderr)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the proxy child: %v", err)
	}
	c := &proxyChild{pid: cmd.Process.Pid, stderr: stderr, in: in, lines: make(chan string, 16)}
	go func() {
		// Owns out until the child exits.
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		in.Close() // the child shuts down at EOF
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := c.next(t)
	a, ok := strings.CutPrefix(line, "addr ")
	if !ok {
		t.Fatalf("proxy child said %q, want its address", line)
	}
	c.addr = a
	return c
}

func (c *proxyChild) next(t testing.TB) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatal("proxy child exited")
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("proxy child did not answer within 20s")
	}
	return ""
}

// mem asks the child to collect and report its memory.
func (c *proxyChild) mem(t testing.TB) childMem {
	t.Helper()
	if _, err := io.WriteString(c.in, "mem\n"); err != nil {
		t.Fatalf("proxy child: %v", err)
	}
	line := c.next(t)
	js, ok := strings.CutPrefix(line, "mem ")
	if !ok {
		t.Fatalf("proxy child said %q, want its memory", line)
	}
	var m childMem
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatalf("proxy child memory %q: %v", js, err)
	}
	return m
}

// kafkaConn is a raw client connection: one request at a time, frames
// built by kmsg. Owned by one goroutine.
type kafkaConn struct {
	c    net.Conn
	f    *kmsg.RequestFormatter
	corr int32
	buf  []byte
}

func dialKafka(addr string, wrap func(net.Conn) net.Conn) (*kafkaConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if wrap != nil {
		c = wrap(c)
	}
	return &kafkaConn{c: c, f: kmsg.NewRequestFormatter(kmsg.FormatterClientID("conn-test"))}, nil
}

// send writes req without waiting for its response.
func (k *kafkaConn) send(req kmsg.Request) error {
	k.corr++
	k.buf = k.f.AppendRequest(k.buf[:0], req, k.corr)
	k.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := k.c.Write(k.buf)
	return err
}

// recv reads one response frame and decodes it into resp (nil: only
// read it).
func (k *kafkaConn) recv(resp kmsg.Response) error {
	k.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(k.c, size[:]); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > 64<<20 {
		return fmt.Errorf("response frame of %d bytes", n)
	}
	if cap(k.buf) < n {
		k.buf = make([]byte, n)
	}
	b := k.buf[:n]
	if _, err := io.ReadFull(k.c, b); err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	body := b[4:]
	if resp.IsFlexible() && resp.Key() != codec.KeyApiVersions {
		// Response header v1, a tag buffer after the correlation id;
		// ApiVersions keeps header v0 at every version (KIP-511).
		if len(body) < 1 || body[0] != 0 {
			return fmt.Errorf("unexpected response header tags")
		}
		body = body[1:]
	}
	return resp.ReadFrom(body)
}

// roundTrip sends req and decodes its response.
func (k *kafkaConn) roundTrip(req kmsg.Request) (kmsg.Response, error) {
	if err := k.send(req); err != nil {
		return nil, err
	}
	resp := req.ResponseKind()
	if err := k.recv(resp); err != nil {
		return nil, fmt.Errorf("%s response: %w", kmsg.NameForKey(req.Key()), err)
	}
	return resp, nil
}

// idleHandshake does what a client does on connecting (ApiVersions, then
// Metadata) and leaves the connection quiet.
func (k *kafkaConn) idleHandshake() (*kmsg.MetadataResponse, error) {
	av := kmsg.NewPtrApiVersionsRequest()
	av.SetVersion(3)
	av.ClientSoftwareName, av.ClientSoftwareVersion = "kproxy-test", "1"
	if _, err := k.roundTrip(av); err != nil {
		return nil, err
	}
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(12)
	resp, err := k.roundTrip(md)
	if err != nil {
		return nil, err
	}
	return resp.(*kmsg.MetadataResponse), nil
}

// lockedBuffer is a bytes.Buffer safe for one writer and other readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func kib(n float64) string { return strconv.FormatFloat(n/1024, 'f', 1, 64) + " KiB" }
