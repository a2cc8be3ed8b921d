package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/testcert"
)

// servedKproxy is a `kproxy serve` started by startServe.
type servedKproxy struct {
	addr string
	logs *syncBuffer
}

// startServe runs `kproxy serve`'s wiring from args until the test ends.
func startServe(t *testing.T, args ...string) *servedKproxy {
	t.Helper()
	cmd, f := serveCmd()
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, log, func(addr string) { ready <- addr }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("kproxy did not stop")
		}
	})
	select {
	case addr := <-ready:
		return &servedKproxy{addr: addr, logs: logs}
	case err := <-done:
		t.Fatalf("kproxy serve did not start: %v\n%s", err, logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("kproxy serve did not start in 20s\n%s", logs)
	}
	return nil
}

// adminURL is the admin server's base URL, from its log line.
func (k *servedKproxy) adminURL(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`msg="admin server listening" addr=(\S+) scheme=(\S+)`).FindStringSubmatch(k.logs.String())
	if m == nil {
		t.Fatalf("no admin address logged:\n%s", k.logs)
	}
	return m[2] + "://" + m[1]
}

// TestPeerMutualTLS runs a fleet in front of one cluster with mutual TLS
// on the peer wire: an owner and a relay whose peer certificates the
// fleet's CA signed, and an intruder relay whose certificate another CA
// signed (it trusts the fleet's CA, so only the owner's check can stop
// it). A relay owns no group, so every group request of its clients
// travels the peer wire: through the good relay a client consumes as a
// group and commits; through the intruder, the owner refuses the
// handshake (one log line naming the unknown authority) and the client
// gets COORDINATOR_NOT_AVAILABLE, as for any unreachable owner.
func TestPeerMutualTLS(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close) // after the kproxies stop (their cleanups run first)
	dir := t.TempDir()
	fleetCA, otherCA := testcert.NewCA(t, "fleet CA"), testcert.NewCA(t, "other CA")
	caFile := fleetCA.WriteCA(t, dir, "fleet-ca")
	ownerCert, ownerKey := fleetCA.Issue(t, "owner").Write(t, dir, "owner")
	relayCert, relayKey := fleetCA.Issue(t, "relay").Write(t, dir, "relay")
	badCert, badKey := otherCA.Issue(t, "intruder").Write(t, dir, "intruder")

	common := []string{
		"--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", "127.0.0.1:0",
		"--fleet-name", "mtls", "--fleet-session-timeout", "3s", "--fleet-heartbeat-interval", "500ms",
		"--group-initial-rebalance-delay", "0s", "--peer-tls-ca", caFile,
	}
	owner := startServe(t, append(common, "--peer-tls-cert", ownerCert, "--peer-tls-key", ownerKey)...)
	relay := startServe(t, append(common, "--fleet-role", "relay", "--peer-tls-cert", relayCert, "--peer-tls-key", relayKey)...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group, n = "relayed", "relayed-group", 10
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range n {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(relay.addr), kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for got := 0; got < n; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d through the relay: %v\nrelay:\n%s\nowner:\n%s", got, n, ctx.Err(), relay.logs, owner.logs)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		got += fs.NumRecords()
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit through the relay: %v", err)
	}
	// The relay owns nothing: the group lives in the owner's engine,
	// reached over the peer wire.
	if !strings.Contains(relay.logs.String(), `role=relay`) {
		t.Fatalf("the relay kproxy did not join as a relay:\n%s", relay.logs)
	}
	if s := owner.logs.String(); strings.Contains(s, "closing peer connection") {
		t.Fatalf("the owner refused a peer connection of its fleet:\n%s", s)
	}

	intruder := startServe(t, append(common, "--fleet-role", "relay", "--peer-tls-cert", badCert, "--peer-tls-key", badKey)...)
	icl, err := kgo.NewClient(kgo.SeedBrokers(intruder.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer icl.Close()
	// Once the intruder's fleet table names the owner, its relayed
	// heartbeat is refused at the owner's TLS handshake.
	waitUntil(t, 15*time.Second, "the owner refusing the intruder's handshake", func() bool {
		hb := kmsg.NewPtrHeartbeatRequest()
		hb.Group, hb.MemberID, hb.Generation = group, "m", 1
		resp, err := hb.RequestWith(ctx, icl.SeedBrokers()[0])
		if err != nil {
			t.Fatalf("heartbeat through the intruder: %v", err)
		}
		if resp.ErrorCode != kerr.CoordinatorNotAvailable.Code {
			t.Fatalf("heartbeat through the intruder: %v, want COORDINATOR_NOT_AVAILABLE", kerr.ErrorForCode(resp.ErrorCode))
		}
		return strings.Contains(owner.logs.String(), "closing peer connection")
	})
	line := ""
	for l := range strings.SplitSeq(owner.logs.String(), "\n") {
		if strings.Contains(l, "closing peer connection") {
			line = l
		}
	}
	if !strings.Contains(line, "TLS handshake failed") || !strings.Contains(line, "unknown authority") {
		t.Errorf("the owner's refusal does not say why: %s", line)
	}
	// The fleet's own relay still gets through.
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = group, "nobody", 1
	rcl, err := kgo.NewClient(kgo.SeedBrokers(relay.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer rcl.Close()
	resp, err := hb.RequestWith(ctx, rcl.SeedBrokers()[0])
	if err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != kerr.UnknownMemberID.Code {
		t.Errorf("a stranger's heartbeat through the relay: %v, want UNKNOWN_MEMBER_ID from the owner's engine", kerr.ErrorForCode(resp.ErrorCode))
	}
}

// TestAdminHTTPS serves the admin API over HTTPS, first without client
// certificates (anyone who trusts the CA reads it; plain HTTP gets no
// answer), then with --admin-tls-client-ca: the probes stay open, every
// other path needs a certificate the client CA signed, and one another
// CA signed fails the handshake.
func TestAdminHTTPS(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close) // after the kproxies stop (their cleanups run first)
	dir := t.TempDir()
	serverCA, clientCA, otherCA := testcert.NewCA(t, "admin CA"), testcert.NewCA(t, "operators CA"), testcert.NewCA(t, "other CA")
	cert, key := serverCA.Issue(t, "admin").Write(t, dir, "admin")
	clientCAFile := clientCA.WriteCA(t, dir, "operators")
	operator, stranger := clientCA.Issue(t, "operator").TLS, otherCA.Issue(t, "stranger").TLS
	common := []string{
		"--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", "127.0.0.1:0", "--groups", "local",
		"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", cert, "--admin-tls-key", key,
	}
	// client presents certs[0] whatever CAs the server names (Go's
	// default would withhold a certificate the server's CA list does
	// not cover; curl and Java send it).
	client := func(certs ...tls.Certificate) *http.Client {
		conf := &tls.Config{RootCAs: serverCA.Pool()}
		if len(certs) > 0 {
			conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
	}
	get := func(cl *http.Client, url string) (int, error) {
		resp, err := cl.Get(url)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	t.Run("https", func(t *testing.T) {
		k := startServe(t, common...)
		base := k.adminURL(t)
		if !strings.HasPrefix(base, "https://") {
			t.Fatalf("admin URL %s, want https", base)
		}
		for _, path := range []string{"/healthz", "/api/groups", "/metrics"} {
			if code, err := get(client(), base+path); err != nil || code != http.StatusOK {
				t.Errorf("GET %s over HTTPS: %d %v, want 200", path, code, err)
			}
		}
		// A client that does not trust the CA fails verification.
		if _, err := get(&http.Client{Timeout: 5 * time.Second}, base+"/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("GET with system roots: %v, want a certificate error", err)
		}
		// Plain HTTP to the HTTPS port is answered 400 by net/http,
		// never with the API.
		plain := "http://" + strings.TrimPrefix(base, "https://")
		if code, err := get(&http.Client{Timeout: 5 * time.Second}, plain+"/api/groups"); err == nil && code == http.StatusOK {
			t.Errorf("plain HTTP to the HTTPS admin port answered 200")
		}
	})

	t.Run("client-certificates", func(t *testing.T) {
		k := startServe(t, append(common, "--admin-tls-client-ca", clientCAFile)...)
		base := k.adminURL(t)
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, err := get(client(), base+path); err != nil || code != http.StatusOK {
				t.Errorf("GET %s without a client certificate: %d %v, want 200", path, code, err)
			}
		}
		for _, path := range []string{"/api/groups", "/metrics", "/"} {
			if code, err := get(client(), base+path); err != nil || code != http.StatusUnauthorized {
				t.Errorf("GET %s without a client certificate: %d %v, want 401", path, code, err)
			}
			if code, err := get(client(operator), base+path); err != nil || code != http.StatusOK {
				t.Errorf("GET %s with the operator's certificate: %d %v, want 200", path, code, err)
			}
		}
		_, err := get(client(stranger), base+"/api/groups")
		if err == nil {
			t.Fatal("a certificate of another CA got an answer")
		}
		waitUntil(t, 5*time.Second, "the admin server logging the refused handshake", func() bool {
			return strings.Contains(k.logs.String(), "TLS handshake error")
		})
	})
}

// TestListenerSecurityValidation: the peer TLS flags go together and
// only with distributed groups; the admin TLS flags go together and
// with an admin listener.
func TestListenerSecurityValidation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" = valid
	}{
		{[]string{"--peer-tls-cert", "c", "--peer-tls-key", "k", "--peer-tls-ca", "ca"}, ""},
		{[]string{"--peer-tls-cert", "c", "--peer-tls-key", "k"}, "go together"},
		{[]string{"--peer-tls-cert", "c", "--peer-tls-key", "k", "--peer-tls-ca", "ca", "--groups", "local"}, "only distributed"},
		{[]string{"--peer-tls-server-name", "kproxy"}, "without --peer-tls-cert"},
		{[]string{"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", "c", "--admin-tls-key", "k", "--admin-tls-client-ca", "ca"}, ""},
		{[]string{"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", "c"}, "go together"},
		{[]string{"--admin-listen", "127.0.0.1:0", "--admin-tls-client-ca", "ca"}, "needs --admin-tls-cert"},
		{[]string{"--admin-tls-cert", "c", "--admin-tls-key", "k"}, "without --admin-listen"},
	} {
		cmd, f := serveCmd()
		if err := cmd.Flags().Parse(append([]string{"--upstream", "127.0.0.1:1"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.resolve()
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	// The config file carries the same settings.
	c := defaultConfig()
	path := t.TempDir() + "/kproxy.yaml"
	testcert.WriteFile(t, path, []byte("peer_tls:\n  cert: c\n  key: k\n  ca: ca\n  server_name: kproxy.fleet\nadmin_tls:\n  cert: ac\n  key: ak\n  client_ca: aca\n"))
	if err := c.loadFile(path); err != nil {
		t.Fatal(err)
	}
	if c.PeerTLS != (peerTLSConfig{"c", "k", "ca", "kproxy.fleet"}) || c.AdminTLS != (adminTLSConfig{"ac", "ak", "aca"}) {
		t.Errorf("config file: peer_tls %+v, admin_tls %+v", c.PeerTLS, c.AdminTLS)
	}
}
