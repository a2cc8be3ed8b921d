package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// messageFleet is router A, owning the groups named a*, and peer server
// B, owning the groups named b*, each with its own registry of kproxy
// messages.
type messageFleet struct {
	msgsA, msgsB *PeerMessages
	psB          *PeerServer
	rA           *Router
	logs         *logBuffer // router A's
}

func newMessageFleet(t *testing.T) *messageFleet {
	t.Helper()
	f := &messageFleet{msgsA: NewPeerMessages(), msgsB: NewPeerMessages(), logs: &logBuffer{}}
	b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
	ps, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Coordinator: b, Logger: testLogger(t), Messages: f.msgsB})
	if err != nil {
		t.Fatalf("peer server: %v", err)
	}
	t.Cleanup(ps.Close)
	f.psB = ps
	f.rA = NewRouter(RouterConfig{
		Local:    &fakeEngine{name: "A", prefix: "a", marker: markerA},
		Locator:  newTestLocator("a", map[string]string{"b": ps.Addr()}),
		Messages: f.msgsA,
		Logger:   slog.New(slog.NewTextHandler(f.logs, nil)),
	})
	t.Cleanup(f.rA.Close)
	return f
}

// echo registers an echo handler of typ on m that prefixes its answer
// with name and the version it got.
func echo(m *PeerMessages, typ, name string, maxVersion int16) {
	m.Handle(typ, maxVersion, func(_ context.Context, version int16, payload []byte) ([]byte, error) {
		return fmt.Appendf(nil, "%s v%d %s", name, version, payload), nil
	})
}

func (f *messageFleet) conn(t *testing.T) *peerConn {
	t.Helper()
	f.rA.pool.mu.Lock()
	defer f.rA.pool.mu.Unlock()
	pc := f.rA.pool.conns[f.psB.Addr()]
	if pc == nil {
		t.Fatal("no connection to B")
	}
	return pc
}

// TestPeerMessageRoundTrip: a message for a group owned elsewhere goes
// over the peer wire to its owner's handler, one owned here to the local
// handler, with type, version and payload intact.
func TestPeerMessageRoundTrip(t *testing.T) {
	f := newMessageFleet(t)
	echo(f.msgsA, "test.echo", "A", 1)
	echo(f.msgsB, "test.echo", "B", 1)
	ctx := context.Background()
	for _, c := range []struct {
		group   string
		version int16
		want    string
	}{
		{"b-group", 1, "B v1 hello"},
		{"b-group", 0, "B v0 hello"},
		{"a-group", 1, "A v1 hello"},
	} {
		got, err := f.rA.SendPeer(ctx, c.group, "test.echo", c.version, []byte("hello"))
		if err != nil || string(got) != c.want {
			t.Fatalf("%s v%d: got %q, %v; want %q", c.group, c.version, got, err, c.want)
		}
	}
	// A big payload and an empty one.
	big := bytes.Repeat([]byte("x"), 1<<20)
	got, err := f.rA.SendPeer(ctx, "b-group", "test.echo", 0, big)
	if err != nil || len(got) != len("B v0 ")+len(big) {
		t.Fatalf("big payload: %d bytes, %v", len(got), err)
	}
	if got, err := f.rA.SendPeer(ctx, "b-group", "test.echo", 0, nil); err != nil || string(got) != "B v0 " {
		t.Fatalf("empty payload: %q, %v", got, err)
	}
	// A version above the handler's is refused, and says which it reads.
	_, err = f.rA.SendPeer(ctx, "b-group", "test.echo", 2, nil)
	var perr *PeerError
	if !errors.Is(err, ErrPeerUnsupportedVersion) || !errors.As(err, &perr) || !strings.Contains(perr.Text, "v0 to v1") {
		t.Fatalf("v2: %v", err)
	}
	// A handler's own error comes back as such.
	f.msgsB.Handle("test.fail", 0, func(context.Context, int16, []byte) ([]byte, error) { return nil, errors.New("no way") })
	if _, err := f.rA.SendPeer(ctx, "b-group", "test.fail", 0, nil); !errors.Is(err, ErrPeerFailed) || !strings.Contains(err.Error(), "no way") {
		t.Fatalf("failing handler: %v", err)
	}
	// A group without an owner: unavailable.
	if _, err := f.rA.SendPeer(ctx, "z-group", "test.echo", 0, nil); !errors.Is(err, ErrPeerUnavailable) {
		t.Fatalf("no owner: %v", err)
	}
}

// TestPeerMessageUnknownType: a type the owner has no handler for is
// answered with an error, logged once by the sender, and the connection
// goes on serving relayed requests and messages.
func TestPeerMessageUnknownType(t *testing.T) {
	f := newMessageFleet(t)
	echo(f.msgsB, "test.echo", "B", 0)
	ctx := context.Background()
	if _, err := f.rA.SendPeer(ctx, "b-group", "test.echo", 0, nil); err != nil {
		t.Fatal(err)
	}
	pc := f.conn(t)
	for range 3 {
		_, err := f.rA.SendPeer(ctx, "b-group", "test.unknown", 0, []byte("x"))
		if !errors.Is(err, ErrPeerUnknownType) {
			t.Fatalf("unknown type: %v", err)
		}
	}
	if n := strings.Count(f.logs.String(), "peer does not know a kproxy message type"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, f.logs.String())
	}
	checkCodes(t, "heartbeat after", handle(t, f.rA, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	if got, err := f.rA.SendPeer(ctx, "b-group", "test.echo", 0, []byte("y")); err != nil || string(got) != "B v0 y" {
		t.Fatalf("after: %q, %v", got, err)
	}
	if f.conn(t) != pc {
		t.Fatal("the connection was replaced")
	}
}

// TestPeerMessageMalformed: a message whose frame does not decode, and
// one whose payload its handler refuses, are answered PeerMalformed while
// a message and a relayed request in flight on the same connection are
// answered as usual.
func TestPeerMessageMalformed(t *testing.T) {
	f := newMessageFleet(t)
	release := make(chan struct{})
	f.msgsB.Handle("test.slow", 0, func(ctx context.Context, _ int16, payload []byte) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return append([]byte("slow "), payload...), nil
	})
	f.msgsB.Handle("test.strict", 0, func(_ context.Context, _ int16, payload []byte) ([]byte, error) {
		if string(payload) != "ok" {
			return nil, fmt.Errorf("payload %q: %w", payload, ErrPeerMalformed)
		}
		return []byte("fine"), nil
	})
	ctx := context.Background()
	if _, err := f.rA.SendPeer(ctx, "b-group", "test.strict", 0, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	pc := f.conn(t)

	type result struct {
		b   []byte
		err error
	}
	slow := make(chan result, 1)
	go func() {
		b, err := f.rA.SendPeer(ctx, "b-group", "test.slow", 0, []byte("answer"))
		slow <- result{b, err}
	}()

	if _, err := f.rA.SendPeer(ctx, "b-group", "test.strict", 0, []byte("{not json")); !errors.Is(err, ErrPeerMalformed) {
		t.Fatalf("refused payload: %v", err)
	}
	// A frame cut short after its type, sent on the same connection.
	for i, cut := range []func([]byte) []byte{
		func(inner []byte) []byte { return inner[:len(inner)-2] },                // the payload truncated
		func(inner []byte) []byte { return append(inner, 1, 2, 3) },              // bytes after the payload
		func(inner []byte) []byte { inner[3] = 9; return inner },                 // a frame version unknown
		func(inner []byte) []byte { return inner[:5] },                           // the header truncated
		func(inner []byte) []byte { inner[8], inner[9] = 0x7f, 0; return inner }, // a type length past the end
	} {
		corr := f.rA.pool.corr.Add(1)
		inner := peerMessageData(corr, peerMessage{typ: "test.strict", payload: []byte("ok")})
		env := kmsg.NewPtrEnvelopeRequest()
		env.RequestData = cut(inner)
		frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID(relayClientID)).AppendRequest(nil, env, corr)
		got := make(chan error, 1)
		f.rA.pool.call(f.psB.Addr(), corr, 5*time.Second, func() []byte { return frame }, func(b []byte, o outcome) {
			if o != outcomeOK {
				got <- fmt.Errorf("outcome %s", o)
				return
			}
			_, err := decodePeerAnswer(b)
			got <- err
		})
		if err := <-got; !errors.Is(err, ErrPeerMalformed) {
			t.Fatalf("malformed frame %d: %v", i, err)
		}
	}
	checkCodes(t, "heartbeat meanwhile", handle(t, f.rA, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	select {
	case r := <-slow:
		t.Fatalf("the slow message was answered before its handler returned: %q, %v", r.b, r.err)
	default:
	}
	close(release)
	if r := <-slow; r.err != nil || string(r.b) != "slow answer" {
		t.Fatalf("the message in flight: %q, %v", r.b, r.err)
	}
	if f.conn(t) != pc {
		t.Fatal("the connection was replaced")
	}
}

// TestPeerMessageOlderKproxy: a kproxy from before peer messages reads a
// message's envelope with decodeInner, which refuses it with
// INVALID_REQUEST (an envelope error, not a closed connection); the
// sender reads that as ErrPeerUnknownType.
func TestPeerMessageOlderKproxy(t *testing.T) {
	inner := peerMessageData(7, peerMessage{typ: "takeover.report", payload: []byte("{}")})
	if _, _, code, err := decodeInner(inner); err == nil || code != errInvalidRequest {
		t.Fatalf("decodeInner: code %d, %v", code, err)
	}
	env := kmsg.NewPtrEnvelopeResponse()
	env.ErrorCode = errInvalidRequest
	frame := codec.AppendResponse(nil, 7, env)
	if _, err := decodePeerAnswer(frame[4:]); !errors.Is(err, ErrPeerUnknownType) {
		t.Fatalf("envelope error read as %v", err)
	}
}
