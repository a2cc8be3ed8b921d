//go:build linux

package proxy

import (
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// TestSlowReader: a client that sends many fetches and stops reading its
// responses makes the proxy stop reading its requests (backpressure on
// that connection: at most Config.MaxInFlight requests queued, the
// session's buffers, and the kernel's socket buffers), while another
// client of the same broker listener keeps getting prompt answers and
// the proxy's heap stays bounded. The proxy runs in a child process so
// that its heap is measured alone.
func TestSlowReader(t *testing.T) {
	const (
		respBytes = 1 << 20 // each fetch response
		stalled   = 1000    // fetches the slow client sends: 1 GB of responses
	)
	up := startFakeUpstream(t)
	up.answer(codec.KeyFetch, 11, fetchResp(respBytes))
	ch := startProxyChild(t, up.addr)

	// Both clients use the broker's own listener, as consumers do.
	boot, err := dialKafka(ch.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer boot.c.Close()
	md, err := boot.idleHandshake()
	if err != nil {
		t.Fatalf("metadata through the proxy: %v", err)
	}
	if len(md.Brokers) != 1 {
		t.Fatalf("metadata lists %d brokers, want 1", len(md.Brokers))
	}
	broker := net.JoinHostPort(md.Brokers[0].Host, strconv.Itoa(int(md.Brokers[0].Port)))
	fast, err := dialKafka(broker, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.c.Close()
	if _, err := fast.roundTrip(fetchReq(11)); err != nil {
		t.Fatalf("fetch through the proxy: %v", err)
	}
	base := ch.mem(t)

	slow, err := dialKafka(broker, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.c.Close()
	var frames []byte
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("slow"))
	for i := range stalled {
		// AppendRequest writes the size at dst[0]: each frame is built
		// on its own, then appended.
		frames = append(frames, f.AppendRequest(nil, fetchReq(11), int32(i))...)
	}
	written := make(chan error, 1)
	go func() {
		slow.c.SetWriteDeadline(time.Now().Add(15 * time.Second))
		_, err := slow.c.Write(frames)
		written <- err
	}()

	// The slow client's stream stalls: the broker answers a bounded
	// number of its fetches, then no more.
	var servedStalled int64
	deadline := time.Now().Add(10 * time.Second)
	for last := int64(-1); ; {
		time.Sleep(300 * time.Millisecond)
		n := up.served.Load() - 1 // the fast client's first fetch
		if n == last && n > 0 {
			servedStalled = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow client's fetches never stalled: %d answered upstream so far", n)
		}
		last = n
	}
	t.Logf("slow client: %d of %d fetches answered upstream (%d MiB) before its connection stalled", servedStalled, stalled, servedStalled*respBytes>>20)
	if servedStalled >= stalled/2 {
		t.Errorf("%d of the slow client's %d fetches reached the broker: the proxy did not stop reading them", servedStalled, stalled)
	}

	// The other client of the same listener and broker is unaffected.
	var lats []time.Duration
	for range 30 {
		start := time.Now()
		if _, err := fast.roundTrip(fetchReq(11)); err != nil {
			t.Fatalf("fetch beside the slow client: %v", err)
		}
		lats = append(lats, time.Since(start))
	}
	slices.Sort(lats)
	t.Logf("fetches of %d KiB beside the stalled client: p50 %v, max %v", respBytes>>10, lats[len(lats)/2], lats[len(lats)-1])
	if max := lats[len(lats)-1]; max > 2*time.Second {
		t.Errorf("a fetch beside the stalled client took %v", max)
	}

	m := ch.mem(t)
	grow := int64(m.HeapInuse+m.StackInuse) - int64(base.HeapInuse+base.StackInuse)
	t.Logf("proxy heap+stacks grew by %s while the slow client held %d MiB of unread responses", kib(float64(grow)), (stalled-servedStalled)*respBytes>>20)
	if grow > 8<<20 {
		t.Errorf("the proxy's heap and stacks grew by %s with one stalled client, want at most 8 MiB", kib(float64(grow)))
	}

	// The slow client resumes: its responses come, in order.
	for i := range 5 {
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(11)
		if err := slow.recv(nil); err != nil {
			t.Fatalf("the slow client's response %d: %v", i, err)
		}
		if corr := int32(slow.buf[0])<<24 | int32(slow.buf[1])<<16 | int32(slow.buf[2])<<8 | int32(slow.buf[3]); corr != int32(i) {
			t.Fatalf("the slow client's response %d has correlation id %d", i, corr)
		}
	}
	slow.c.Close()
	<-written
}
