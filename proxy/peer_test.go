package proxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// readPeerFrame reads one answer frame (after its size prefix) from a
// raw peer connection.
func readPeerFrame(t *testing.T, conn net.Conn) []byte {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, b); err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	return b
}

// envelopeError decodes an answer frame's envelope error code.
func envelopeError(t *testing.T, frame []byte) (int32, int16) {
	t.Helper()
	body := frame[5:] // correlation id, empty header tags
	env := kmsg.NewPtrEnvelopeResponse()
	if err := env.ReadFrom(body); err != nil {
		t.Fatalf("envelope response: %v", err)
	}
	return int32(binary.BigEndian.Uint32(frame)), env.ErrorCode
}

// TestPeerGarbageClosesOnlyThatConnection writes bytes that are no
// envelope to the peer port: that connection closes with one log line,
// and a router's connection to the same server keeps serving.
func TestPeerGarbageClosesOnlyThatConnection(t *testing.T) {
	f := newFleet(t, nil)
	checkCodes(t, "heartbeat before", handle(t, f.rA, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	f.rA.pool.mu.Lock()
	pc := f.rA.pool.conns[f.psB.Addr()]
	f.rA.pool.mu.Unlock()

	for i, garbage := range [][]byte{
		append([]byte{0, 0, 0, 16}, bytes.Repeat([]byte{0xff}, 16)...), // unknown api key
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0x7f, 0xff, 0xff, 0xff},                                                       // a frame over the limit
		kmsg.NewRequestFormatter().AppendRequest(nil, heartbeatFor("b-group", "m"), 1), // a Heartbeat, not an Envelope
		append([]byte{0, 0, 0, 12}, 0, 58, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0, 0x55),      // an Envelope whose body does not decode
	} {
		bad, err := net.Dial("tcp", f.psB.Addr())
		if err != nil {
			t.Fatal(err)
		}
		bad.Write(garbage)
		bad.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.Copy(io.Discard, bad); err != nil || n != 0 {
			t.Fatalf("garbage %d: connection not closed (%d bytes, %v)", i, n, err)
		}
		bad.Close()
		waitFor(t, 5*time.Second, "the log line", func() bool {
			return strings.Count(f.logs.String(), "closing peer connection") == i+1
		})
	}
	checkCodes(t, "heartbeat after", handle(t, f.rA, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	f.rA.pool.mu.Lock()
	same := f.rA.pool.conns[f.psB.Addr()] == pc
	f.rA.pool.mu.Unlock()
	if !same {
		t.Fatalf("the router's connection was replaced")
	}
	logs := f.logs.String()
	if strings.Count(logs, "closing peer connection") != 5 || !strings.Contains(logs, "expected Envelope v0, got Heartbeat") ||
		!strings.Contains(logs, "malformed Envelope request") {
		t.Fatalf("logs:\n%s", f.logs.String())
	}
}

// TestPeerRefusesNonGroupRequests sends envelopes holding a request that
// is not a group API, one that does not decode and one of a version too
// new: each gets an envelope error and a log line, the connection stays
// open and serves a heartbeat after them.
func TestPeerRefusesNonGroupRequests(t *testing.T) {
	f := newFleet(t, nil)
	conn, err := net.Dial("tcp", f.psB.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wrap := func(corr int32, inner []byte) []byte {
		env := kmsg.NewPtrEnvelopeRequest()
		env.RequestData = inner
		return kmsg.NewRequestFormatter().AppendRequest(nil, env, corr)
	}
	meta := appendEnvelope(nil, 1, Client{ID: "x"}, kmsg.NewPtrMetadataRequest())
	tooNew := kmsg.NewPtrHeartbeatRequest()
	tooNew.Version = tooNew.MaxVersion()
	tooNewInner := kmsg.NewRequestFormatter().AppendRequest(nil, tooNew, 3)[4:]
	binary.BigEndian.PutUint16(tooNewInner[2:], uint16(tooNew.MaxVersion()+1))
	for _, tc := range []struct {
		corr  int32
		frame []byte
		code  int16
	}{
		{1, meta, errInvalidRequest},
		{2, wrap(2, []byte{0, 12, 0, 4, 0, 0}), errInvalidRequest}, // truncated inner header
		{3, wrap(3, tooNewInner), errUnsupportedVersion},
		{4, wrap(4, []byte{0, 12, 0, 0, 0, 0, 0, 4, 0, 1, 'x', 0, 1}), errInvalidRequest}, // Heartbeat v0 cut short
	} {
		conn.Write(tc.frame)
		corr, code := envelopeError(t, readPeerFrame(t, conn))
		if corr != tc.corr || code != tc.code {
			t.Fatalf("envelope %d: answer %d with code %d, want code %d", tc.corr, corr, code, tc.code)
		}
	}
	hb := heartbeatFor("b-group", "m")
	conn.Write(appendEnvelope(nil, 9, Client{ID: "raw", Host: "192.0.2.1"}, hb))
	frame := readPeerFrame(t, conn)
	resp, o, _, err := decodeRelayed(frame, hb.Key(), hb.Version)
	if err != nil || o != outcomeOK || int32(binary.BigEndian.Uint32(frame)) != 9 {
		t.Fatalf("heartbeat after the refusals: %v %v", o, err)
	}
	checkCodes(t, "raw heartbeat", resp, markerB)
	if calls := f.b.calls(); len(calls) != 1 || calls[0].c != (Client{ID: "raw", Host: "192.0.2.1"}) {
		t.Fatalf("B got %+v", calls)
	}
	if !strings.Contains(f.logs.String(), "refusing relayed request") || strings.Contains(f.logs.String(), "closing peer connection") {
		t.Fatalf("logs:\n%s", f.logs.String())
	}
}

// TestEnvelopeCarriesTheInnerRequest checks the wire format documented in
// peer.go: the envelope's RequestData is the client's request with its
// header and the envelope's correlation id, ClientHostAddress the
// client's IP bytes.
func TestEnvelopeCarriesTheInnerRequest(t *testing.T) {
	for _, tc := range []struct {
		host string
		ip   []byte
	}{
		{"10.1.2.3", []byte{10, 1, 2, 3}},
		{"::ffff:10.1.2.3", []byte{10, 1, 2, 3}},
		{"2001:db8::1", net.ParseIP("2001:db8::1")},
		{"not-an-ip", nil},
	} {
		for _, req := range []kmsg.Request{heartbeatFor("g", "m"), func() kmsg.Request {
			r := kmsg.NewPtrHeartbeatRequest() // v0: request header v1, not flexible
			r.Group = "g"
			return r
		}()} {
			frame := appendEnvelope(nil, 42, Client{ID: "cid", Host: tc.host}, req)
			if int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
				t.Fatalf("size prefix %d for %d bytes", binary.BigEndian.Uint32(frame), len(frame)-4)
			}
			h, inner, code, err := func() (hdr any, r kmsg.Request, c int16, e error) {
				env := kmsg.NewPtrEnvelopeRequest()
				// envelope header v2: key, version, corr, client id, tags
				off := 4 + 8 + 2 + len(relayClientID) + 1
				if err := env.ReadFrom(frame[off:]); err != nil {
					return nil, nil, 0, err
				}
				if !bytes.Equal(env.ClientHostAddress, tc.ip) {
					t.Fatalf("host %s encoded as %v", tc.host, env.ClientHostAddress)
				}
				ih, r, c, e := decodeInner(env.RequestData)
				if ih.CorrelationID != 42 || string(ih.ClientID) != "cid" {
					t.Fatalf("inner header %+v", ih)
				}
				return ih, r, c, e
			}()
			if err != nil || code != 0 || h == nil {
				t.Fatalf("inner request: %v (code %d)", err, code)
			}
			if got := inner.(*kmsg.HeartbeatRequest); got.Group != "g" || got.Version != req.GetVersion() {
				t.Fatalf("inner request %+v", got)
			}
		}
		if got := hostString(hostBytes(tc.host)); tc.ip != nil && got != net.IP(tc.ip).String() {
			t.Fatalf("host %s round trips to %s", tc.host, got)
		}
	}
}
