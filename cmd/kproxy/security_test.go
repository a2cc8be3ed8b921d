package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kproxy/kproxy/internal/testcert"
)

// TestServeSASLSSLUpstream runs `kproxy serve`'s wiring, from its flags,
// in front of a cluster that requires TLS and SCRAM-SHA-256 (kfake in
// distributed mode, transactions included), with a TLS listener of its
// own and an admin token: kproxy's own client (discovery, fleet, group
// store) authenticates with its configured credentials, and a client
// that speaks TLS to kproxy and SASL to the cluster through it consumes
// as a group and commits. The password appears in no log line and no
// admin answer; the admin API needs the token, the probes do not.
func TestServeSASLSSLUpstream(t *testing.T) {
	const password = "kproxy-s3cret-Pa55word"
	clusterCA, listenerCA := testcert.NewCA(t, "cluster CA"), testcert.NewCA(t, "listener CA")
	broker := clusterCA.Issue(t, "broker")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{broker.TLS}}),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "kproxy", password),
		kfake.User("SCRAM-SHA-256", "app", "app-password"),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close) // after kproxy stops (startServe's cleanup runs first)

	dir := t.TempDir()
	caFile := clusterCA.WriteCA(t, dir, "cluster-ca")
	certFile, keyFile := listenerCA.Issue(t, "kproxy").Write(t, dir, "listener")
	passFile, tokenFile := filepath.Join(dir, "password"), filepath.Join(dir, "token")
	os.WriteFile(passFile, []byte(password+"\n"), 0o600)
	const token = "admin-t0ken-value"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	args := []string{
		"--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--admin-token-file", tokenFile,
		"--tls-cert", certFile, "--tls-key", keyFile,
		"--upstream-tls", "--upstream-tls-ca", caFile,
		"--upstream-sasl-mechanism", "SCRAM-SHA-256", "--upstream-sasl-username", "kproxy",
		"--upstream-sasl-password-file", passFile,
		"--group-initial-rebalance-delay", "0s",
		"--fleet-session-timeout", "3s", "--fleet-heartbeat-interval", "500ms",
		"--log-level", "debug",
		// kfake without ACLs answers DescribeAcls with an empty list,
		// not SECURITY_DISABLED as a broker without an authorizer does,
		// so auto would deny the app's group (e2e/authz_test.go covers
		// authorization).
		"--group-authorization", "off",
	}
	k := startServe(t, args...)
	addr, logs := k.addr, k.logs

	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer tcancel()
	appSASL := kgo.SASL(scram.Auth{User: "app", Pass: "app-password"}.AsSha256Mechanism())
	appTLS := kgo.DialTLSConfig(&tls.Config{RootCAs: listenerCA.Pool()})
	const topic, group, n = "secure", "secure-group", 20
	prod, err := kgo.NewClient(kgo.SeedBrokers(addr), appTLS, appSASL, kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range n {
		if err := prod.ProduceSync(tctx, &kgo.Record{Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatalf("produce through kproxy: %v\n%s", err, logs)
		}
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), appTLS, appSASL, kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for got := 0; got < n; {
		fs := cons.PollFetches(tctx)
		if tctx.Err() != nil {
			t.Fatalf("consumed %d of %d: %v\n%s", got, n, tctx.Err(), logs)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		got += fs.NumRecords()
	}
	if err := cons.CommitUncommittedOffsets(tctx); err != nil {
		t.Fatalf("commit through kproxy: %v", err)
	}
	// The commit reached the cluster's own __consumer_offsets, written
	// by kproxy's authenticated client.
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.DialTLSConfig(&tls.Config{RootCAs: clusterCA.Pool()}),
		kgo.SASL(scram.Auth{User: "kproxy", Pass: password}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	waitUntil(t, 10*time.Second, "the commit visible at the cluster", func() bool {
		offs, err := kadm.NewClient(direct).FetchOffsets(tctx, group)
		if err != nil {
			return false
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.Err == nil {
				sum += o.At
			}
		})
		return sum == n
	})

	// Admin: token required except for the probes.
	adminURL := k.adminURL(t)
	var bodies strings.Builder
	get := func(path, tok string) int {
		req, _ := http.NewRequestWithContext(tctx, http.MethodGet, adminURL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		bodies.Write(b)
		return resp.StatusCode
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := get(path, ""); code != http.StatusOK {
			t.Errorf("GET %s without a token: %d, want 200", path, code)
		}
	}
	for _, path := range []string{"/api/groups", "/api/fleet", "/metrics", "/"} {
		if code := get(path, ""); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, code)
		}
		if code := get(path, "wrong-"+token); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", path, code)
		}
		if code := get(path, token); code != http.StatusOK {
			t.Errorf("GET %s with the token: %d, want 200", path, code)
		}
	}
	if code := get("/api/groups/"+group, token); code != http.StatusOK {
		t.Errorf("GET /api/groups/%s: %d", group, code)
	}
	for what, out := range map[string]string{"logs": logs.String(), "admin answers": bodies.String()} {
		for _, s := range []string{password, token, "app-password"} {
			if strings.Contains(out, s) {
				t.Errorf("the %s carry a secret (%q)", what, s)
			}
		}
	}
	if !strings.Contains(bodies.String(), group) {
		t.Errorf("the admin API does not show the group:\n%s", bodies.String())
	}
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUpstreamPassword: the password comes from the file, else the
// environment; there is no flag for its value; every printed form of it
// is redacted.
func TestUpstreamPassword(t *testing.T) {
	env := map[string]string{passwordEnv: "from-env"}
	getenv := func(k string) string { return env[k] }
	file := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(file, []byte("from-file\r\n"), 0o600)

	p, err := upstreamPassword(upstreamSASLConfig{Mechanism: "PLAIN", Username: "u", PasswordFile: file}, getenv)
	if err != nil || p.reveal() != "from-file" {
		t.Errorf("password file: %q, %v", p.reveal(), err)
	}
	p, err = upstreamPassword(upstreamSASLConfig{Mechanism: "PLAIN", Username: "u"}, getenv)
	if err != nil || p.reveal() != "from-env" {
		t.Errorf("environment: %q, %v", p.reveal(), err)
	}
	if _, err := upstreamPassword(upstreamSASLConfig{Mechanism: "PLAIN", Username: "u"}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), passwordEnv) {
		t.Errorf("no password: %v", err)
	}
	if _, err := upstreamPassword(upstreamSASLConfig{PasswordFile: filepath.Join(t.TempDir(), "none")}, getenv); err == nil {
		t.Error("a missing password file was accepted")
	}

	var out strings.Builder
	slog.New(slog.NewJSONHandler(&out, nil)).Info("x", "password", p, "any", any(p))
	slog.New(slog.NewTextHandler(&out, nil)).Info("x", "password", p)
	j, _ := json.Marshal(struct{ P secret }{p})
	out.Write(j)
	fmt.Fprintf(&out, "%v %s %+v %#v", p, p, p, p)
	if strings.Contains(out.String(), "from-env") {
		t.Errorf("a printed form carries the password: %s", out.String())
	}

	cmd, _ := serveCmd()
	if err := cmd.Flags().Parse([]string{"--upstream-sasl-password", "x"}); err == nil {
		t.Error("a flag carries the password value")
	}
}

// TestSecurityConfig: the config file's keys mirror the flags, flags
// override them, and inconsistent settings are refused all at once.
func TestSecurityConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.yaml")
	os.WriteFile(path, []byte(`upstream: [a:1]
tls: {cert: c.pem, key: k.pem, client_ca: ca.pem, min_version: "1.3", handshake_timeout: 5s}
upstream_tls: {enabled: true, ca: up.pem, cert: uc.pem, key: uk.pem, server_name: kafka.internal}
upstream_sasl: {mechanism: SCRAM-SHA-512, username: kp, password_file: /run/pw}
admin_token_file: /run/token
`), 0o600)
	cmd, f := serveCmd()
	if err := cmd.Flags().Parse([]string{"--config", path, "--tls-cert", "flag.pem", "--upstream-sasl-username", "other"}); err != nil {
		t.Fatal(err)
	}
	c, err := f.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	want := fileConfig{
		TLS:            listenerTLSConfig{Cert: "flag.pem", Key: "k.pem", ClientCA: "ca.pem", MinVersion: "1.3", HandshakeTimeout: 5 * time.Second},
		UpstreamTLS:    upstreamTLSConfig{Enabled: true, CA: "up.pem", Cert: "uc.pem", Key: "uk.pem", ServerName: "kafka.internal"},
		UpstreamSASL:   upstreamSASLConfig{Mechanism: "SCRAM-SHA-512", Username: "other", PasswordFile: "/run/pw"},
		AdminTokenFile: "/run/token",
	}
	if c.TLS != want.TLS || c.UpstreamTLS != want.UpstreamTLS || c.UpstreamSASL != want.UpstreamSASL || c.AdminTokenFile != want.AdminTokenFile {
		t.Errorf("resolved %+v %+v %+v %q", c.TLS, c.UpstreamTLS, c.UpstreamSASL, c.AdminTokenFile)
	}

	bad := defaultConfig()
	bad.Upstream = []string{"a:1"}
	bad.TLS = listenerTLSConfig{Cert: "c.pem", MinVersion: "1.1"}
	bad.UpstreamTLS = upstreamTLSConfig{CA: "x.pem"}
	bad.UpstreamSASL = upstreamSASLConfig{Mechanism: "GSSAPI"}
	err = bad.validate()
	for _, s := range []string{"--tls-cert and --tls-key", "min_version", "without --upstream-tls", "GSSAPI"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("validation error %v does not mention %q", err, s)
		}
	}
}

// TestAdminAuth: the probes are open, everything else needs the exact
// token.
func TestAdminAuth(t *testing.T) {
	h := adminAuth(secret("tok"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", http.StatusTeapot},
		{"/readyz", "", http.StatusTeapot},
		{"/api/groups", "", http.StatusUnauthorized},
		{"/api/groups", "Bearer to", http.StatusUnauthorized},
		{"/api/groups", "Bearer tok2", http.StatusUnauthorized},
		{"/api/groups", "Basic tok", http.StatusUnauthorized},
		{"/api/groups", "tok", http.StatusUnauthorized},
		{"/api/groups", "Bearer tok", http.StatusTeapot},
		{"/healthz/../api/groups", "", http.StatusUnauthorized},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s %q: %d, want %d", tc.path, tc.auth, rec.Code, tc.want)
		}
		if rec.Code == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", tc.path)
		}
	}
}

// TestTapWithAdminToken: `kproxy tap --admin-token-file` sends the token;
// without it an admin server that requires one refuses the stream.
func TestTapWithAdminToken(t *testing.T) {
	srv := httptest.NewServer(adminAuth(secret("tap-token"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "id: 1\ndata: {\"seq\":1,\"kind\":\"member_left\",\"group\":\"g\"}\n\n")
	})))
	defer srv.Close()
	var out, errOut syncBuffer
	if err := runTap(context.Background(), tapOptions{admin: srv.URL}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("tap without the token: %v, want a 401 refusal", err)
	}
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte("tap-token\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runTap(ctx, tapOptions{admin: srv.URL, token: file, retry: time.Millisecond}, &out, &errOut)
	}()
	waitLines(t, &out, 1)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("tap with the token: %v", err)
	}
}
