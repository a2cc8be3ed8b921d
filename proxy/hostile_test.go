package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// heapInuse returns the heap in use after a collection.
func heapInuse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// groupFrameStart returns the start of a JoinGroup frame whose size
// prefix announces size bytes, followed by fill bytes of its body.
func groupFrameStart(size int, fill int) []byte {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 5
	req.Group, req.ProtocolType = "hostile", "consumer"
	b := kmsg.NewRequestFormatter(kmsg.FormatterClientID("hostile")).AppendRequest(nil, req, 1)
	binary.BigEndian.PutUint32(b, uint32(size))
	return append(b, make([]byte, fill)...)
}

// expectClosed waits for the proxy to close conn, reading what it sends.
func expectClosed(t *testing.T, conn net.Conn, within time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(within))
	if _, err := io.Copy(io.Discard, conn); err != nil && !isReset(err) {
		t.Fatalf("connection not closed by the proxy within %v: %v", within, err)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// hasLine reports whether some log line names the peer and contains want.
func hasLine(logs *logBuffer, peer, want string) bool {
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, peer) && strings.Contains(line, want) {
			return true
		}
	}
	return false
}

// TestHeldFramesBounded announces group frames kproxy must read whole:
// ten 100 MiB frames are refused on their size prefix, and of ten 7 MiB
// frames stalled after 64 KiB only as many as the process budget holds
// are read (the rest refused with a log line), each holding about what
// arrived, not what it announced. The memory goes back when they end.
func TestHeldFramesBounded(t *testing.T) {
	c := newCluster(t)
	logs := &logBuffer{}
	const budget = 32 << 20
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		cfg.Coordinator = &recordingCoordinator{}
		cfg.FrameMemory = budget
	})
	before := heapInuse()

	for range 10 {
		conn, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(groupFrameStart(100<<20, 64<<10)); err != nil && !isReset(err) {
			t.Fatal(err)
		}
		expectClosed(t, conn, 5*time.Second)
		peer := conn.LocalAddr().String()
		waitFor(t, 5*time.Second, "the frame-too-large log line", func() bool { return hasLine(logs, peer, "over the 8388608 byte limit") })
		conn.Close()
	}

	const size = 7 << 20
	var stalled []net.Conn
	refused := 0
	for i := range 10 {
		conn, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write(groupFrameStart(size, 64<<10)); err != nil {
			t.Fatal(err)
		}
		fits := (i+1)*(size+4) <= budget
		if fits {
			stalled = append(stalled, conn)
			waitFor(t, 5*time.Second, "the frame's reservation", func() bool { return p.budget.used.Load() == int64(len(stalled)*(size+4)) })
			continue
		}
		refused++
		expectClosed(t, conn, 5*time.Second)
		peer := conn.LocalAddr().String()
		waitFor(t, 5*time.Second, "the budget log line", func() bool { return hasLine(logs, peer, "frame memory budget exhausted") })
	}
	if len(stalled) != budget/(size+4) || refused != 10-len(stalled) {
		t.Fatalf("%d frames held, %d refused; want %d held", len(stalled), refused, budget/(size+4))
	}
	grown := heapInuse() - before
	t.Logf("heap grew %d KiB with %d stalled %d MiB frames", grown>>10, len(stalled), size>>20)
	if grown > 8<<20 {
		t.Errorf("heap grew %d MiB with %d stalled frames of which 64 KiB arrived", grown>>20, len(stalled))
	}
	for _, conn := range stalled {
		conn.Close()
	}
	waitFor(t, 5*time.Second, "the budget to be released", func() bool { return p.budget.used.Load() == 0 })
}

// hostileCase is one connection of the battery: what it sends, and how
// long the proxy may take to close it.
type hostileCase struct {
	name   string
	send   func(conn net.Conn) error
	within time.Duration
	reason string // in the proxy's log line for the connection; "" for none
}

func sendAll(b []byte) func(net.Conn) error {
	return func(conn net.Conn) error { _, err := conn.Write(b); return err }
}

// TestHostileBattery throws bad input at the proxy's socket while a
// well-behaved client produces and consumes through it: that client
// sees no error and loses no record, every hostile connection is closed
// within its bound, and the heap stays bounded while stalled frames are
// held and comes back once they are gone.
func TestHostileBattery(t *testing.T) {
	c := newCluster(t)
	logs := &logBuffer{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		cfg.Coordinator = &recordingCoordinator{}
		cfg.RequestTimeout = time.Second
		cfg.MaxConnectionsPerHost = 100
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "hostile"
	good := newClient(t, p.Addr(), kgo.DefaultProduceTopic(topic), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.FetchMaxWait(100*time.Millisecond))
	if _, err := kadm.NewClient(good).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	before := heapInuse()

	// The well-behaved client.
	var produced, consumed atomic.Int64
	var goodErrs atomic.Int64
	stopGood := make(chan struct{})
	goodDone := make(chan struct{})
	go func() {
		defer close(goodDone)
		for {
			select {
			case <-stopGood:
				return
			case <-time.After(5 * time.Millisecond):
			}
			good.Produce(ctx, &kgo.Record{Value: []byte("v")}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Errorf("good client produce: %v", err)
					goodErrs.Add(1)
					return
				}
				produced.Add(1)
			})
		}
	}()
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for ctx.Err() == nil {
			fs := good.PollFetches(ctx)
			fs.EachError(func(tp string, part int32, err error) {
				if ctx.Err() == nil {
					t.Errorf("good client fetch %s/%d: %v", tp, part, err)
					goodErrs.Add(1)
				}
			})
			consumed.Add(int64(fs.NumRecords()))
		}
	}()

	apiVersions := func(clientID string) []byte {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 3
		req.ClientSoftwareName, req.ClientSoftwareVersion = "hostile", "1"
		return kmsg.NewRequestFormatter(kmsg.FormatterClientID(clientID)).AppendRequest(nil, req, 1)
	}
	metadataV99 := binary.BigEndian.AppendUint32(nil, 12)
	metadataV99 = append(metadataV99, 0, 3, 0, 99, 0, 0, 0, 1, 0xff, 0xff, 0, 0)
	garbage := make([]byte, 8<<10)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	copy(garbage, []byte{0x02, 0x34, 0x56, 0x78}) // a 37 MB size prefix
	halfFrame := append(binary.BigEndian.AppendUint32(nil, 1000), apiVersions("half")[4:]...)
	slow := apiVersions("slowloris")
	cases := []hostileCase{
		{"garbage", sendAll(garbage), 4 * time.Second, "read timeout"},
		{"size -1", sendAll([]byte{0xff, 0xff, 0xff, 0xff}), 2 * time.Second, "negative frame size"},
		{"size 0", sendAll([]byte{0, 0, 0, 0}), 2 * time.Second, "frame too small"},
		{"size 2 GiB", sendAll([]byte{0x7f, 0xff, 0xff, 0xff}), 2 * time.Second, "frame larger than the limit"},
		{"truncated", func(conn net.Conn) error {
			if _, err := conn.Write(halfFrame[:20]); err != nil {
				return err
			}
			return conn.(*net.TCPConn).CloseWrite()
		}, 2 * time.Second, "truncated frame"},
		{"TLS ClientHello", sendAll([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}), 2 * time.Second, "TLS sent to a plaintext listener"},
		{"HTTP GET", sendAll([]byte("GET / HTTP/1.1\r\nHost: kafka\r\n\r\n")), 2 * time.Second, "HTTP sent to a Kafka listener"},
		{"unknown key", sendAll([]byte{0, 0, 0, 10, 0x03, 0xe7, 0, 0, 0, 0, 0, 1, 0xff, 0xff}), 2 * time.Second, "unknown api key 999"},
		{"unknown version", sendAll(metadataV99), 2 * time.Second, "responses cannot be rewritten"},
		{"half frame", sendAll(halfFrame), 4 * time.Second, "read timeout"},
		{"slowloris", func(conn net.Conn) error {
			for _, b := range slow {
				if _, err := conn.Write([]byte{b}); err != nil {
					return nil // closed by the proxy: what we want
				}
				time.Sleep(200 * time.Millisecond)
			}
			return nil
		}, 5 * time.Second, "read timeout"},
	}
	for range 10 {
		cases = append(cases,
			hostileCase{"group frame 100 MiB", sendAll(groupFrameStart(100<<20, 64<<10)), 2 * time.Second, "over the 8388608 byte limit"},
			hostileCase{"group frame 7 MiB stalled", sendAll(groupFrameStart(7<<20, 64<<10)), 4 * time.Second, ""})
	}

	var wg sync.WaitGroup
	for _, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Errorf("%s: dial: %v", tc.name, err)
				return
			}
			defer conn.Close()
			peer := conn.LocalAddr().String()
			start := time.Now()
			if err := tc.send(conn); err != nil && !isReset(err) {
				t.Errorf("%s: send: %v", tc.name, err)
				return
			}
			conn.SetReadDeadline(start.Add(tc.within))
			if _, err := io.Copy(io.Discard, conn); err != nil && !isReset(err) {
				t.Errorf("%s: not closed within %v: %v", tc.name, tc.within, err)
				return
			}
			if tc.reason != "" {
				waitFor(t, 2*time.Second, tc.name+" log line", func() bool { return hasLine(logs, peer, tc.reason) })
			}
		}()
	}
	// The heap while the ten stalled 7 MiB frames are held.
	waitFor(t, 3*time.Second, "the stalled group frames to be held", func() bool { return p.budget.used.Load() == 10*(7<<20+4) })
	peak := heapInuse() - before
	// A 32 KiB client id is valid: the request is answered.
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		if _, err := conn.Write(apiVersions(strings.Repeat("x", 32<<10-1))); err != nil {
			t.Error(err)
			return
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			t.Errorf("32 KiB client id: no answer: %v", err)
		}
	}()
	// A flood from another address: past the per-host limit, connections
	// are closed at accept with a log line; the good client, on another
	// address, is not affected.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var flood []net.Conn
	for range 300 {
		conn, err := d.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatalf("flood dial: %v", err)
		}
		flood = append(flood, conn)
	}
	var closed atomic.Int64
	var fwg sync.WaitGroup
	for _, conn := range flood {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				closed.Add(1)
			}
		}()
	}
	fwg.Wait()
	closedAtAccept := closed.Load()
	if closedAtAccept != 200 {
		t.Errorf("%d of 300 flood connections closed at accept, want 200 (limit 100 per host)", closedAtAccept)
	}
	if !strings.Contains(logs.String(), "connection refused: limit reached") {
		t.Error("no log line for the connection limit")
	}

	wg.Wait()
	for _, conn := range flood {
		conn.Close()
	}
	close(stopGood)
	<-goodDone
	if err := good.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every record consumed", func() bool { return consumed.Load() >= produced.Load() })
	cancel()
	<-consDone
	waitFor(t, 5*time.Second, "the frame budget released", func() bool { return p.budget.used.Load() == 0 })
	after := heapInuse() - before
	t.Logf("good client: %d produced, %d consumed; heap growth with stalled frames %d KiB, after %d KiB", produced.Load(), consumed.Load(), peak>>10, after>>10)
	if goodErrs.Load() != 0 || produced.Load() == 0 {
		t.Errorf("good client: %d errors, %d produced", goodErrs.Load(), produced.Load())
	}
	if peak > 64<<20 {
		t.Errorf("heap grew %d MiB while hostile frames were stalled", peak>>20)
	}
	if after > 16<<20 {
		t.Errorf("heap still %d MiB above the start after the hostile connections ended", after>>20)
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", logs.String())
	}
}

// TestIdleTimeout closes a connection that is silent for the idle
// timeout, but not one whose request is still being answered (a
// JoinGroup waiting for its rebalance), as Kafka's
// connections.max.idle.ms.
func TestIdleTimeout(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Coordinator = &recordingCoordinator{delay: 1500 * time.Millisecond}
		cfg.IdleTimeout = 300 * time.Millisecond
	})
	silent, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	expectClosed(t, silent, 3*time.Second)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("closed after %v, before the idle timeout", d)
	}

	waiting, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	join := kmsg.NewPtrJoinGroupRequest()
	join.Version = 5
	join.Group, join.ProtocolType, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = "idle", "consumer", 10000, 10000
	rawRequest(t, waiting, join, 7, "idle-test")
	if corr, _ := readResponse(t, waiting, join); corr != 7 {
		t.Fatalf("answer to correlation id %d, want 7", corr)
	}
	expectClosed(t, waiting, 3*time.Second)
}
