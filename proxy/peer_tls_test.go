package proxy

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testcert"
)

// TestPeerTLS serves the peer wire over mutual TLS: a router whose
// certificate the fleet's CA signed relays to the owner; one with a
// certificate of another CA gets COORDINATOR_NOT_AVAILABLE and the
// owner logs why; plaintext to the TLS peer port and a peer silent
// mid-handshake are each closed with one log line, and the router's
// connection keeps serving throughout.
func TestPeerTLS(t *testing.T) {
	fleetCA, otherCA := testcert.NewCA(t, "fleet CA"), testcert.NewCA(t, "other CA")
	dir := t.TempDir()
	caFile := fleetCA.WriteCA(t, dir, "fleet")
	source := func(ca *testcert.CA, name string) *TLSSource {
		cert, key := ca.Issue(t, name).Write(t, dir, name)
		return newTLSSource(t, TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: caFile, HandshakeTimeout: 300 * time.Millisecond}, nil)
	}
	logs := &logBuffer{}
	b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
	ps, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Coordinator: b, TLS: source(fleetCA, "owner"),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.Close)
	router := func(src *TLSSource) *Router {
		dial, err := PeerTLSDialer(src, "")
		if err != nil {
			t.Fatal(err)
		}
		r := NewRouter(RouterConfig{Locator: newTestLocator("a", map[string]string{"b": ps.Addr()}), Dialer: dial,
			Logger: testLogger(t), WaitForOwner: 100 * time.Millisecond})
		t.Cleanup(r.Close)
		return r
	}
	good := router(source(fleetCA, "relay"))
	checkCodes(t, "heartbeat over mutual TLS", handle(t, good, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)

	bad := router(source(otherCA, "intruder"))
	checkCodes(t, "heartbeat from a certificate of another CA", handle(t, bad, Client{ID: "c"}, heartbeatFor("b-group", "m")), errCoordinatorNotAvailable)
	waitFor(t, 5*time.Second, "the refusal", func() bool { return strings.Contains(logs.String(), "unknown authority") })

	plain, err := net.Dial("tcp", ps.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.Write(appendEnvelope(nil, 1, Client{ID: "c"}, heartbeatFor("b-group", "m")))
	plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, plain)
	waitFor(t, 5*time.Second, "the plaintext log line", func() bool { return strings.Contains(logs.String(), "plaintext sent to a TLS peer listener") })

	silent, err := net.Dial("tcp", ps.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.Copy(io.Discard, silent); n != 0 || err != nil {
		t.Fatalf("the silent peer's connection: %d bytes, %v; want closed", n, err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("a silent peer was dropped after %v, the handshake timeout is 300ms", took)
	}
	waitFor(t, 5*time.Second, "the timeout log line", func() bool { return strings.Contains(logs.String(), "TLS handshake not complete within 300ms") })

	checkCodes(t, "heartbeat after", handle(t, good, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	// The intruder's router reconnects with backoff while its request
	// is retried, and each reconnection is refused again.
	bad.Close()
	intruder := strings.Count(logs.String(), "unknown authority")
	if n := strings.Count(logs.String(), "closing peer connection") - intruder; intruder < 1 || n != 2 {
		t.Errorf("%d intruder refusals and %d others logged, want at least 1 and 2 (plaintext, silent):\n%s", intruder, n, logs)
	}
}
