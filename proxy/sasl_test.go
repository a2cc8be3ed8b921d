package proxy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/kproxy/kproxy/codec"
	"github.com/kproxy/kproxy/internal/testcert"
)

// saslSession is a session with only what the SASL observation needs.
func saslSession(requireSASL bool, logs *bytes.Buffer) *session {
	return &session{
		p:   &Proxy{cfg: Config{RequireSASL: requireSASL}, metrics: newMetrics(nil)},
		log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// sendReq shows the session a request as its reader does.
func sendReq(t *testing.T, s *session, req kmsg.Request) {
	t.Helper()
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("test")).AppendRequest(nil, req, 1)
	h, err := codec.ParseRequestHeader(frame[4:])
	if err != nil {
		t.Fatal(err)
	}
	if d := codec.RouteFor(h.Key, h.Version, true); d.Edit != codec.EditObserve {
		t.Fatalf("%s v%d is routed %v/%v, not observed", kmsg.NameForKey(h.Key), h.Version, d.Route, d.Edit)
	}
	s.observeSASLRequest(h, frame, len(frame))
}

// sendResp shows the session a SaslAuthenticate response as its writer
// does.
func sendResp(t *testing.T, s *session, code int16, auth []byte) {
	t.Helper()
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	resp.SetVersion(2)
	resp.ErrorCode, resp.SASLAuthBytes = code, auth
	frame := codec.AppendResponse(nil, 1, resp)
	body, err := codec.ResponseBody(frame[4:], codec.KeySaslAuthenticate, 2)
	if err != nil {
		t.Fatal(err)
	}
	s.observeSASLResponse(codec.KeySaslAuthenticate, 2, body)
}

func handshake(mech string) kmsg.Request {
	r := kmsg.NewPtrSASLHandshakeRequest()
	r.SetVersion(1)
	r.Mechanism = mech
	return r
}

func authenticate(b []byte) kmsg.Request {
	r := kmsg.NewPtrSASLAuthenticateRequest()
	r.SetVersion(2)
	r.SASLAuthBytes = b
	return r
}

func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + ".c2ln"
}

// TestSASLPrincipal: the session learns the principal from the SASL
// exchange it passes through, only once the broker accepted it at the
// mechanism's last step; until then, with the cluster requiring SASL, a
// group request closes the connection. No password or token reaches
// the log.
func TestSASLPrincipal(t *testing.T) {
	const password, token = "pw-Secret-1", "sub-claim-carol"
	bearer := jwt(`{"sub":"` + token + `","exp":4102444800}`)
	type step struct {
		req  kmsg.Request // or a response:
		code int16
		auth []byte
	}
	for _, c := range []struct {
		name      string
		steps     []step
		done      bool
		principal string
	}{
		{"nothing yet", nil, false, ""},
		{"PLAIN accepted", []step{{req: handshake("PLAIN")}, {req: authenticate([]byte("\x00alice\x00" + password))}, {}}, true, "User:alice"},
		{"PLAIN refused", []step{{req: handshake("PLAIN")}, {req: authenticate([]byte("\x00alice\x00" + password))}, {code: kerr.SaslAuthenticationFailed.Code}}, false, ""},
		{"SCRAM after its first response", []step{{req: handshake("SCRAM-SHA-256")}, {req: authenticate([]byte("n,,n=bob,r=abc"))}, {auth: []byte("r=abcdef,s=c2FsdA==,i=4096")}}, false, ""},
		{"SCRAM accepted", []step{{req: handshake("SCRAM-SHA-512")}, {req: authenticate([]byte("n,,n=b=2Cob,r=abc"))}, {auth: []byte("r=abcdef,s=c2FsdA==,i=4096")},
			{req: authenticate([]byte("c=biws,r=abcdef,p=cHJvb2Y="))}, {auth: []byte("v=c2ln")}}, true, "User:b,ob"},
		{"OAUTHBEARER accepted", []step{{req: handshake("OAUTHBEARER")}, {req: authenticate([]byte("n,,\x01auth=Bearer " + bearer + "\x01\x01"))}, {}}, true, "User:" + token},
		{"OAUTHBEARER refused: error challenge, then error", []step{{req: handshake("OAUTHBEARER")}, {req: authenticate([]byte("n,,\x01auth=Bearer " + bearer + "\x01\x01"))},
			{auth: []byte(`{"status":"invalid_token"}`)}, {req: authenticate([]byte{1})}, {code: kerr.SaslAuthenticationFailed.Code}}, false, ""},
		{"GSSAPI accepted, principal unknown", []step{{req: handshake("GSSAPI")}, {req: authenticate([]byte{0x60, 1, 2})}, {auth: []byte{0x60, 9}},
			{req: authenticate(nil)}, {auth: []byte{5, 4}}, {req: authenticate([]byte{5, 4, 1})}, {}}, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := saslSession(true, &logs)
			for _, st := range c.steps {
				if st.req != nil {
					sendReq(t, s, st.req)
				} else {
					sendResp(t, s, st.code, st.auth)
				}
			}
			err := s.authGate(codec.RequestHeader{Key: codec.KeyJoinGroup})
			if c.done != (err == nil) {
				t.Fatalf("gate: %v, want authenticated=%v", err, c.done)
			}
			if err != nil && !errors.Is(err, errUnauthenticated) {
				t.Fatalf("gate: %v, not errUnauthenticated", err)
			}
			if s.rc.Principal != c.principal || s.rc.Authenticated != c.done {
				t.Fatalf("client %+v, want principal %q authenticated %v", s.rc, c.principal, c.done)
			}
			if strings.Contains(logs.String(), password) || strings.Contains(logs.String(), bearer) {
				t.Fatalf("a secret reached the log: %s", logs.String())
			}
		})
	}
	// Without RequireSASL an unauthenticated session passes the gate
	// with no principal (authz then sees User:ANONYMOUS).
	s := saslSession(false, &bytes.Buffer{})
	if err := s.authGate(codec.RequestHeader{Key: codec.KeyJoinGroup}); err != nil || s.rc.Principal != "" || s.rc.Authenticated {
		t.Fatalf("gate without RequireSASL: %v %+v", err, s.rc)
	}
}

// clientRecorder answers every request with an error and records
// the client it came from.
type clientRecorder struct {
	mu      sync.Mutex
	clients []Client
}

func (r *clientRecorder) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	r.mu.Lock()
	r.clients = append(r.clients, c)
	r.mu.Unlock()
	reply(codec.GroupErrorResponse(req, kerr.NotCoordinator.Code))
}

// TestMTLSPrincipal: on an mTLS listener without SASL the principal
// handed to the coordinator is the verified client certificate's
// subject in the form Kafka's default ssl.principal.mapping.rules give
// (X500Principal.getName(), RFC 2253, most specific first).
func TestMTLSPrincipal(t *testing.T) {
	serverCA, clientCA := testcert.NewCA(t, "server CA"), testcert.NewCA(t, "client CA")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "alice", OrganizationalUnit: []string{"eng"}, Organization: []string{"acme"}},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, clientCA.Cert, &key.PublicKey, clientCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t)
	coord := &clientRecorder{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.TLS = newTLSSource(t, tlsFiles(t, serverCA, clientCA), testLogger(t))
		cfg.Coordinator = coord
	})
	cl := newClient(t, p.Addr(), kgo.RetryTimeout(time.Second), kgo.DialTLSConfig(&tls.Config{
		RootCAs:      serverCA.Pool(),
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = "g", "m", 1
	// The recorder answers NOT_COORDINATOR, which kgo may retry until
	// its retry timeout.
	resp, err := hb.RequestWith(ctx, cl)
	if err != nil && !errors.Is(err, kerr.NotCoordinator) || err == nil && resp.ErrorCode != kerr.NotCoordinator.Code {
		t.Fatalf("heartbeat: %v %+v, want the recorder's NOT_COORDINATOR", err, resp)
	}
	coord.mu.Lock()
	defer coord.mu.Unlock()
	if len(coord.clients) == 0 {
		t.Fatal("the coordinator saw no request")
	}
	for _, got := range coord.clients {
		if got.Principal != "User:CN=alice,OU=eng,O=acme" || !got.Authenticated || net.ParseIP(got.Host) == nil {
			t.Fatalf("coordinator saw client %+v, want principal User:CN=alice,OU=eng,O=acme from an IP", got)
		}
	}
}

// TestUnauthenticatedCloseCounted: a group request refused for want of
// SASL is counted as kproxy.refused{reason=unauthenticated}, so that an
// operator sees clients that skip authentication.
func TestUnauthenticatedCloseCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	var logs bytes.Buffer
	s := saslSession(true, &logs)
	s.p.metrics = newMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err := s.authGate(codec.RequestHeader{Key: codec.KeyJoinGroup}); !errors.Is(err, errUnauthenticated) {
		t.Fatalf("gate before SASL: %v, want errUnauthenticated", err)
	}
	if n := counterByReason(reader, "kproxy.refused", "unauthenticated"); n != 1 {
		t.Fatalf("kproxy.refused{reason=unauthenticated} = %d, want 1", n)
	}
}
