package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/testcert"
)

// tlsFiles writes a server certificate signed by ca into a temporary
// directory and returns a TLSConfig naming the files.
func tlsFiles(t *testing.T, ca *testcert.CA, clientCA *testcert.CA) TLSConfig {
	t.Helper()
	dir := t.TempDir()
	cert, key := ca.Issue(t, "kproxy").Write(t, dir, "server")
	cfg := TLSConfig{CertFile: cert, KeyFile: key, ReloadInterval: 20 * time.Millisecond}
	if clientCA != nil {
		cfg.ClientCAFile = clientCA.WriteCA(t, dir, "clients")
	}
	return cfg
}

func newTLSSource(t *testing.T, cfg TLSConfig, log *slog.Logger) *TLSSource {
	t.Helper()
	src, err := NewTLSSource(cfg, log)
	if err != nil {
		t.Fatalf("tls source: %v", err)
	}
	return src
}

// startTLSProxy starts a proxy in front of c whose client listeners
// speak TLS with the files of files; it logs into logs when not nil.
func startTLSProxy(t *testing.T, c *kfake.Cluster, files TLSConfig, logs *logBuffer) *Proxy {
	t.Helper()
	src := newTLSSource(t, files, testLogger(t))
	return startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.TLS = src
		if logs != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		}
	})
}

// tlsRoundTrip is roundTrip by a TLS client that trusts ca, within 15s.
func tlsRoundTrip(t *testing.T, addr string, ca *testcert.CA) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return roundTrip(t, ctx, addr, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool()}))
}

// roundTrip produces one record through cl and reads it back from the
// start of a fresh single-partition topic, through every listener the
// client is sent to.
func roundTrip(t *testing.T, ctx context.Context, addr string, opts ...kgo.Opt) error {
	t.Helper()
	topic := "tls-" + strings.ReplaceAll(t.Name(), "/", "-")
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation(),
		kgo.RetryTimeout(3 * time.Second)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("over tls")}).FirstErr(); err != nil {
		return err
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fs.Err(); err != nil {
			return err
		}
		for _, r := range fs.Records() {
			if string(r.Value) == "over tls" {
				return nil
			}
		}
	}
}

// TestTLSListener: with Config.TLS every listener (the bootstrap one and
// each broker's) speaks TLS: a TLS client produces and consumes, and the
// certificate it is shown is the configured one.
func TestTLSListener(t *testing.T) {
	c := newCluster(t)
	ca := testcert.NewCA(t, "listener CA")
	p := startTLSProxy(t, c, tlsFiles(t, ca, nil), nil)
	if err := tlsRoundTrip(t, p.Addr(), ca); err != nil {
		t.Fatalf("TLS client through the proxy: %v", err)
	}
	// A client that does not trust the CA is refused.
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := roundTrip(t, short, p.Addr(), kgo.DialTLSConfig(&tls.Config{RootCAs: x509.NewCertPool()})); err == nil {
		t.Fatal("a client that does not trust the listener's CA got through")
	}
}

// TestMTLSListener: with a client CA every listener requires a client
// certificate signed by it.
func TestMTLSListener(t *testing.T) {
	c := newCluster(t)
	ca := testcert.NewCA(t, "listener CA")
	clients := testcert.NewCA(t, "client CA")
	logs := &logBuffer{}
	p := startTLSProxy(t, c, tlsFiles(t, ca, clients), logs)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	good := clients.Issue(t, "app")
	if err := roundTrip(t, ctx, p.Addr(), kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{good.TLS}})); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	for name, certs := range map[string][]tls.Certificate{
		"no certificate":            nil,
		"certificate of another CA": {testcert.NewCA(t, "rogue").Issue(t, "app").TLS},
	} {
		conn, err := tls.Dial("tcp", p.Addr(), &tls.Config{RootCAs: ca.Pool(), Certificates: certs})
		if err == nil {
			// TLS 1.3: the server's verdict arrives with the first read.
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Write(apiVersionsFrame(1))
			if err == nil {
				_, err = conn.Read(make([]byte, 1))
			}
			conn.Close()
		}
		if err == nil {
			t.Errorf("%s: connection served", name)
		}
	}
	waitFor(t, 5*time.Second, "two handshake failures logged", func() bool {
		return strings.Count(logs.String(), "TLS handshake failed") == 2
	})
}

// apiVersionsFrame is an ApiVersions v0 request frame.
func apiVersionsFrame(corr int32) []byte {
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 0
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("tls-test")).AppendRequest(nil, req, corr)
}

// askVersions sends ApiVersions on conn and checks the answer.
func askVersions(conn net.Conn, corr int32) error {
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write(apiVersionsFrame(corr)); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		return err
	}
	if got := int32(binary.BigEndian.Uint32(body)); got != corr {
		return errors.New("wrong correlation id")
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(body[4:]); err != nil {
		return err
	}
	if resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		return errors.New("bad ApiVersions answer")
	}
	return nil
}

// TestTLSCertificateRotation replaces the listener's certificate and key
// on disk: a client connected before keeps its connection and is served
// on it, and new connections are shown the new certificate, without a
// restart.
func TestTLSCertificateRotation(t *testing.T) {
	c := newCluster(t)
	oldCA, newCA := testcert.NewCA(t, "old CA"), testcert.NewCA(t, "new CA")
	cfg := tlsFiles(t, oldCA, nil)
	logs := &logBuffer{}
	src := newTLSSource(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.TLS = src })

	both := oldCA.Pool()
	both.AddCert(newCA.Cert)
	dial := func() (*tls.Conn, error) {
		return tls.Dial("tcp", p.Addr(), &tls.Config{RootCAs: both})
	}
	before, err := dial()
	if err != nil {
		t.Fatalf("dial before rotation: %v", err)
	}
	defer before.Close()
	oldLeaf := before.ConnectionState().PeerCertificates[0]
	if !bytes.Equal(oldLeaf.RawIssuer, oldCA.Cert.RawSubject) {
		t.Fatal("first connection not shown the old certificate")
	}
	if err := askVersions(before, 1); err != nil {
		t.Fatalf("request before rotation: %v", err)
	}

	// Rotate: the key first, then the certificate, as a careless tool
	// would; the half-rotated pair must not be served.
	leaf := newCA.Issue(t, "kproxy rotated")
	testcert.WriteFile(t, cfg.KeyFile, leaf.KeyPEM)
	time.Sleep(50 * time.Millisecond)
	if conn, err := dial(); err != nil {
		t.Fatalf("dial while half rotated: %v", err)
	} else {
		if !bytes.Equal(conn.ConnectionState().PeerCertificates[0].Raw, oldLeaf.Raw) {
			t.Error("half-rotated files: a new connection was not shown the old certificate")
		}
		conn.Close()
	}
	testcert.WriteFile(t, cfg.CertFile, leaf.CertPEM)

	waitFor(t, 5*time.Second, "new connections shown the new certificate", func() bool {
		conn, err := dial()
		if err != nil {
			return false
		}
		defer conn.Close()
		return bytes.Equal(conn.ConnectionState().PeerCertificates[0].RawIssuer, newCA.Cert.RawSubject)
	})
	if err := askVersions(before, 2); err != nil {
		t.Fatalf("the connection from before the rotation: %v", err)
	}
	// The new certificate is verified against the new CA only.
	conn, err := tls.Dial("tcp", p.Addr(), &tls.Config{RootCAs: newCA.Pool()})
	if err != nil {
		t.Fatalf("dial with the new CA only: %v", err)
	}
	if err := askVersions(conn, 3); err != nil {
		t.Fatalf("request after rotation: %v", err)
	}
	conn.Close()
	out := logs.String()
	if !strings.Contains(out, "tls reload failed") || strings.Count(out, "tls certificate reloaded") != 1 {
		t.Errorf("want one reload failure (half rotated) and one reload logged:\n%s", out)
	}
}

// TestTLSWrongProtocol: plaintext to a TLS listener, TLS to a plaintext
// listener and a client stuck mid-handshake each close that connection
// with one log line saying why, while other clients are served.
func TestTLSWrongProtocol(t *testing.T) {
	c := newCluster(t)
	ca := testcert.NewCA(t, "CA")
	tlsLogs, plainLogs := &logBuffer{}, &logBuffer{}
	cfg := tlsFiles(t, ca, nil)
	cfg.HandshakeTimeout = 300 * time.Millisecond
	tp := startTLSProxy(t, c, cfg, tlsLogs)
	pp := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(plainLogs, nil))
	})

	closed := func(conn net.Conn) error {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(conn)
		return err // nil: EOF, the proxy closed it
	}

	// Plaintext Kafka to the TLS listener.
	conn, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(apiVersionsFrame(1))
	if err := closed(conn); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Errorf("plaintext to TLS: connection not closed: %v", err)
	}
	conn.Close()

	// TLS to the plaintext listener.
	_, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", pp.Addr(), &tls.Config{RootCAs: ca.Pool()})
	if err == nil {
		t.Error("TLS handshake with a plaintext listener succeeded")
	}

	// Stuck mid-handshake: connects, sends nothing.
	start := time.Now()
	conn, err = net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := closed(conn); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Errorf("stuck handshake: connection not closed: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("stuck handshake dropped after %v, want about 300ms", d)
	}
	conn.Close()

	waitFor(t, 5*time.Second, "log lines", func() bool {
		return strings.Count(tlsLogs.String(), "closing client connection") == 2 &&
			strings.Count(plainLogs.String(), "closing client connection") == 1
	})
	if n := strings.Count(tlsLogs.String(), "plaintext sent to a TLS listener"); n != 1 {
		t.Errorf("plaintext-to-TLS lines: %d, want 1:\n%s", n, tlsLogs)
	}
	if n := strings.Count(tlsLogs.String(), "TLS handshake not complete within 300ms"); n != 1 {
		t.Errorf("handshake timeout lines: %d, want 1:\n%s", n, tlsLogs)
	}
	if n := strings.Count(plainLogs.String(), "TLS sent to a plaintext listener"); n != 1 {
		t.Errorf("TLS-to-plaintext lines: %d, want 1:\n%s", n, plainLogs)
	}
	// Others are still served.
	if err := tlsRoundTrip(t, tp.Addr(), ca); err != nil {
		t.Fatalf("TLS client after bad input: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	// On a loaded machine the good client's own handshake may take
	// longer than the test's 300ms limit: that line is the limit
	// working (the client retried and got through), not bad input.
	//
	// Nor is a "bad record MAC" on the good client's connection: kgo,
	// closing, cuts a request it is writing with a write deadline of
	// now, and crypto/tls's close_notify then fails the proxy's check
	// (TestTLSClientCutWrite shows how; seen once in CI and once in
	// about 12,700 kgo client lifetimes under CPU load). That line is
	// the client's doing: reported, not failed on.
	logs := tlsLogs.String()
	mac := strings.Count(logs, "tls: bad record MAC")
	if mac > 0 {
		t.Logf("the good client's TLS stream failed its integrity check on %d connection(s):\n%s", mac, logs)
	}
	if n := strings.Count(logs, "closing client connection") - strings.Count(logs, "TLS handshake not complete within 300ms") - mac; n != 1 {
		t.Errorf("a good client caused a log line:\n%s", tlsLogs)
	}
}

// TestTLSClientCutWrite: a Go client whose write its own deadline cut
// before any byte left (kgo does that to a request it is writing when it
// closes) has spent a record sequence number in crypto/tls, so the
// close_notify its Close sends next does not verify. The proxy closes
// that connection with the reason, one line, and serves everyone else.
func TestTLSClientCutWrite(t *testing.T) {
	c := newCluster(t)
	ca := testcert.NewCA(t, "CA")
	logs := &logBuffer{}
	p := startTLSProxy(t, c, tlsFiles(t, ca, nil), logs)
	conn, err := tls.Dial("tcp", p.Addr(), &tls.Config{RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := askVersions(conn, 1); err != nil {
		t.Fatalf("before the cut write: %v", err)
	}
	conn.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := conn.Write(apiVersionsFrame(2)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past its deadline: %v, want a deadline error", err)
	}
	conn.Close()
	waitFor(t, 5*time.Second, "the connection's closing line", func() bool {
		return strings.Contains(logs.String(), "tls: bad record MAC")
	})
	if n := strings.Count(logs.String(), "closing client connection"); n != 1 {
		t.Errorf("closing lines: %d, want 1:\n%s", n, logs)
	}
	if err := tlsRoundTrip(t, p.Addr(), ca); err != nil {
		t.Fatalf("another TLS client: %v", err)
	}
}

// TestTLSUpstream: in front of a TLS-only cluster, the proxy's sessions
// dial brokers over TLS and its discovery client too, while the client
// speaks plaintext to the proxy.
func TestTLSUpstream(t *testing.T) {
	ca := testcert.NewCA(t, "cluster CA")
	leaf := ca.Issue(t, "broker")
	c := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{leaf.TLS}}))
	up := &tls.Config{RootCAs: ca.Pool()}
	logs := &logBuffer{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.UpstreamTLS = up
		cfg.UpstreamClientOpts = []kgo.Opt{kgo.DialTLSConfig(up)}
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := roundTrip(t, ctx, p.Addr()); err != nil {
		t.Fatalf("plaintext client through a TLS upstream: %v\n%s", err, logs)
	}

	// Upstream TLS the proxy cannot verify: the client's connection is
	// closed with the reason, and the broker's listener stays open.
	bad := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.UpstreamTLS = &tls.Config{RootCAs: x509.NewCertPool()}
		cfg.UpstreamClientOpts = []kgo.Opt{kgo.DialTLSConfig(up)}
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	conn, err := net.Dial("tcp", bad.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := askVersions(conn, 1); err == nil {
		t.Fatal("served through an upstream whose certificate does not verify")
	}
	waitFor(t, 5*time.Second, "the TLS failure logged", func() bool {
		return strings.Contains(logs.String(), "TLS handshake with broker")
	})
	if strings.Contains(logs.String(), "broker unreachable") {
		t.Errorf("a TLS failure closed a broker listener:\n%s", logs)
	}
}
