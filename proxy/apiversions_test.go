package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/faultnet"
)

// relayedDial sends every upstream connection of a proxy through a
// fault relay of its own per broker address.
type relayedDial struct {
	t      testing.TB
	mu     sync.Mutex
	relays map[string]*faultnet.Relay // guarded by mu
}

func (d *relayedDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	r := d.relays[addr]
	if r == nil {
		var err error
		if r, err = faultnet.Listen(addr); err != nil {
			d.mu.Unlock()
			return nil, err
		}
		d.relays[addr] = r
		d.t.Cleanup(func() { r.Close() })
	}
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, r.Addr())
}

func (d *relayedDial) each(f func(*faultnet.Relay)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.relays {
		f(r)
	}
}

// sendRequest writes req on conn with correlation id corr.
func sendRequest(t testing.TB, conn net.Conn, req kmsg.Request, corr int32) {
	t.Helper()
	b := kmsg.NewRequestFormatter(kmsg.FormatterClientID("apiv-test")).AppendRequest(nil, req, corr)
	if _, err := conn.Write(b); err != nil {
		t.Fatalf("writing %s: %v", kmsg.NameForKey(req.Key()), err)
	}
}

// readAnswer reads one response on conn within d into resp, checking its
// correlation id.
func readAnswer(conn net.Conn, d time.Duration, corr int32, resp kmsg.Response) error {
	conn.SetReadDeadline(time.Now().Add(d))
	defer conn.SetReadDeadline(time.Time{})
	var hdr [8]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if got := int32(binary.BigEndian.Uint32(hdr[4:])); got != corr {
		return fmt.Errorf("correlation id %d, want %d", got, corr)
	}
	body := make([]byte, size-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		return err
	}
	if resp.IsFlexible() && resp.Key() != 18 {
		n := int(body[0]) // tag count: 0 in every response here
		if n != 0 {
			return fmt.Errorf("unexpected response header tags")
		}
		body = body[1:]
	}
	return resp.ReadFrom(body)
}

// TestApiVersionsAnsweredWhenBrokerSilent: a new connection's ApiVersions
// that the broker does not answer (kproxy's path to it blackholed) is
// answered from the broker's last answer within ApiVersionsTimeout; the
// connection keeps working, the broker's late answer is dropped and the
// next forwarded request gets its own answer after heal; a client that
// gives up on a connection during the fault frees its session.
func TestApiVersionsAnsweredWhenBrokerSilent(t *testing.T) {
	cluster := newCluster(t, kfake.NumBrokers(1))
	d := &relayedDial{t: t, relays: map[string]*faultnet.Relay{}}
	const timeout = 300 * time.Millisecond
	p := startProxy(t, cluster.ListenAddrs(), func(c *Config) {
		c.Dial = d.dial
		c.ApiVersionsTimeout = timeout
	})

	ask := func(conn net.Conn, corr int32, within time.Duration) (*kmsg.ApiVersionsResponse, error) {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 3
		req.ClientSoftwareName, req.ClientSoftwareVersion = "apiv-test", "1"
		sendRequest(t, conn, req, corr)
		resp := kmsg.NewPtrApiVersionsResponse()
		resp.Version = 3
		return resp, readAnswer(conn, within, corr, resp)
	}
	healthy, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer healthy.Close()
	want, err := ask(healthy, 1, 5*time.Second)
	if err != nil || want.ErrorCode != 0 {
		t.Fatalf("ApiVersions on a healthy path: %v (code %d)", err, want.ErrorCode)
	}

	d.each(func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) })
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	got, err := ask(conn, 7, 5*time.Second)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("ApiVersions with the broker silent: no answer: %v", err)
	}
	if took < timeout || took > timeout+2*time.Second {
		t.Errorf("answered after %v, want just past the %v timeout", took, timeout)
	}
	if got.ErrorCode != 0 || !slices.EqualFunc(got.ApiKeys, want.ApiKeys, func(a, b kmsg.ApiVersionsResponseApiKey) bool {
		return a.ApiKey == b.ApiKey && a.MinVersion == b.MinVersion && a.MaxVersion == b.MaxVersion
	}) {
		t.Errorf("answer from the cache differs from the broker's last: code %d, %d keys vs %d", got.ErrorCode, len(got.ApiKeys), len(want.ApiKeys))
	}
	// The next request waits for the broker, as it would directly.
	meta := kmsg.NewPtrMetadataRequest()
	meta.Version = 9
	sendRequest(t, conn, meta, 8)
	mresp := kmsg.NewPtrMetadataResponse()
	mresp.Version = 9
	if err := readAnswer(conn, 500*time.Millisecond, 8, mresp); err == nil {
		t.Fatal("Metadata answered while the broker is blackholed")
	}

	// A client that gives up during the fault: its session ends.
	gone, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	sendRequest(t, gone, meta, 1)
	waitFor(t, 5*time.Second, "the three sessions", func() bool { return sessionCount(p) == 3 })
	gone.Close()
	waitFor(t, 5*time.Second, "the closed client's session to end with the broker silent", func() bool { return sessionCount(p) == 2 })

	d.each(func(r *faultnet.Relay) { r.Heal() })
	// The late ApiVersions answer is dropped: the Metadata answer is
	// the next the client reads.
	if err := readAnswer(conn, 5*time.Second, 8, mresp); err != nil {
		t.Fatalf("Metadata after heal: %v", err)
	}
	if len(mresp.Brokers) != 1 {
		t.Errorf("Metadata after heal lists %d brokers, want 1", len(mresp.Brokers))
	}
	// And the connection goes on.
	if _, err := ask(conn, 9, 5*time.Second); err != nil {
		t.Fatalf("ApiVersions after heal: %v", err)
	}
}

func sessionCount(p *Proxy) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}

// TestApiVersionsAnsweredWhenDialHangs: where connecting to the broker
// hangs (a partition that drops the connection attempt), a new
// connection's ApiVersions is answered from the broker's last answer
// within ApiVersionsTimeout instead of after the whole dial timeout; the
// next forwarded request still dials with the full timeout and, failing,
// resets the connection as a dead broker does.
func TestApiVersionsAnsweredWhenDialHangs(t *testing.T) {
	cluster := newCluster(t, kfake.NumBrokers(1))
	var hang atomic.Bool
	const timeout, dialTimeout = 300 * time.Millisecond, 1500 * time.Millisecond
	p := startProxy(t, cluster.ListenAddrs(), func(c *Config) {
		c.ApiVersionsTimeout, c.DialTimeout = timeout, dialTimeout
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if hang.Load() {
				<-ctx.Done()
				return nil, fmt.Errorf("dialling %s: %w", addr, ctx.Err())
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
	ask := func(conn net.Conn, corr int32) (*kmsg.ApiVersionsResponse, error) {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 3
		req.ClientSoftwareName, req.ClientSoftwareVersion = "apiv-test", "1"
		sendRequest(t, conn, req, corr)
		resp := kmsg.NewPtrApiVersionsResponse()
		resp.Version = 3
		return resp, readAnswer(conn, 5*time.Second, corr, resp)
	}
	first, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := ask(first, 1); err != nil {
		t.Fatalf("ApiVersions with the broker reachable: %v", err)
	}

	hang.Store(true)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	resp, err := ask(conn, 2)
	if took := time.Since(start); err != nil || resp.ErrorCode != 0 || took > dialTimeout {
		t.Fatalf("ApiVersions with the dial hanging: %v (code %d) after %v; want an answer within the %v dial timeout", err, resp.ErrorCode, took, dialTimeout)
	}
	meta := kmsg.NewPtrMetadataRequest()
	meta.Version = 9
	sendRequest(t, conn, meta, 3)
	mresp := kmsg.NewPtrMetadataResponse()
	mresp.Version = 9
	start = time.Now()
	err = readAnswer(conn, 5*time.Second, 3, mresp)
	if err == nil {
		t.Fatal("Metadata answered although the broker cannot be dialled")
	}
	if took := time.Since(start); took < dialTimeout-100*time.Millisecond || took > dialTimeout+2*time.Second {
		t.Errorf("connection closed %v after the Metadata request (%v), want after the %v dial timeout", took, err, dialTimeout)
	}
}
