package proxy

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

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
