package proxy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kproxy/kproxy/internal/faultnet"
)

// counterByOutcome reads the int64 counter name summed over its points
// with outcome=o; -1 when collecting fails.
func counterByOutcome(r *sdkmetric.ManualReader, name, o string) int64 {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, _ := dp.Attributes.Value("outcome"); v.AsString() == o {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestSilentPeerIsFound puts a fault relay on the peer link into owner B
// and blackholes it, both ways and each way alone. The connection stays
// open but nothing is answered: the relay finds it silent within the
// relay timeout (the request in flight gets COORDINATOR_NOT_AVAILABLE
// then, not after the timeout), and every request after it fails at once
// instead of waiting the timeout again; the episode is logged at WARN
// once and counted once in kproxy.relay.peer_unreachable, however many
// reconnections fail. After heal a reconnection finds B and requests
// reach it again at once, the recovery logged once.
func TestSilentPeerIsFound(t *testing.T) {
	for _, dir := range []faultnet.Direction{faultnet.Both, faultnet.ToClient, faultnet.ToTarget} {
		t.Run(dir.String(), func(t *testing.T) {
			b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
			ps := startPeerServer(t, "127.0.0.1:0", b, nil)
			link, err := faultnet.Listen(ps.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { link.Close() })
			rec := &logRecorder{}
			reader := sdkmetric.NewManualReader()
			const relayTimeout = 3 * time.Second
			r := NewRouter(RouterConfig{Locator: newTestLocator("a", map[string]string{"b": link.Addr()}),
				RelayTimeout: relayTimeout, WaitForOwner: 100 * time.Millisecond, Logger: slog.New(rec),
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
			t.Cleanup(r.Close)
			hb := func() (int16, time.Duration) {
				start := time.Now()
				return codesOf(t, handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")))[0], time.Since(start)
			}
			if c, _ := hb(); c != markerB {
				t.Fatalf("before the fault: code %d", c)
			}

			link.Blackhole(dir)
			c, first := hb()
			if c != codeUnavailable || first >= relayTimeout {
				t.Fatalf("the request in flight when B went silent: code %d after %v, want %d within the %v relay timeout", c, first, codeUnavailable, relayTimeout)
			}
			var worst time.Duration
			for range 20 {
				c, d := hb()
				if c != codeUnavailable {
					t.Fatalf("while B is silent: code %d", c)
				}
				worst = max(worst, d)
				time.Sleep(100 * time.Millisecond) // 2 s: several reconnections
			}
			if worst > 100*time.Millisecond {
				t.Fatalf("a request while B is known silent waited %v; want an answer at once", worst)
			}
			t.Logf("%v blackholed: silence found after %v; later requests answered within %v", dir, first, worst)
			if n := rec.count(slog.LevelWarn, "peer unreachable"); n != 1 {
				t.Fatalf("%d WARN lines for one episode, want 1", n)
			}
			if n := counterByOutcome(reader, "kproxy.relay.peer_unreachable", "silent"); n != 1 {
				t.Fatalf("kproxy.relay.peer_unreachable{outcome=silent} = %d, want 1", n)
			}
			if n := counterByOutcome(reader, "kproxy.relay.requests", "owner_down"); n < 20 {
				t.Fatalf("kproxy.relay.requests{outcome=owner_down} = %d, want at least 20", n)
			}

			link.Heal()
			healed := time.Now()
			waitFor(t, 10*time.Second, "B answering after heal", func() bool { c, _ := hb(); return c == markerB })
			recovered := time.Since(healed)
			t.Logf("%v: recovered %v after heal", dir, recovered)
			// A reconnection always waits for its keepalive's answer
			// (the next one starts as soon as one goes unanswered), so
			// the held keepalive's answer ends the episode at heal, not
			// up to a reconnection backoff (1s) later.
			if recovered > 500*time.Millisecond {
				t.Fatalf("recovered %v after heal; want within 500ms", recovered)
			}
			if n := rec.count(slog.LevelInfo, "peer reachable again"); n != 1 {
				t.Fatalf("%d recovery lines, want 1", n)
			}
			if n := rec.count(slog.LevelWarn, "peer unreachable"); n != 1 {
				t.Fatalf("%d WARN lines after recovery, want still 1", n)
			}
		})
	}
}

// TestIdlePeerKeepalive: an idle peer connection to a live owner is kept
// (keepalives answered), with no episode.
func TestIdlePeerKeepalive(t *testing.T) {
	b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
	ps := startPeerServer(t, "127.0.0.1:0", b, nil)
	link, err := faultnet.Listen(ps.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	rec := &logRecorder{}
	r := NewRouter(RouterConfig{Locator: newTestLocator("a", map[string]string{"b": link.Addr()}),
		RelayTimeout: 600 * time.Millisecond, Logger: slog.New(rec)})
	t.Cleanup(r.Close)
	checkCodes(t, "first", handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	time.Sleep(time.Second) // five keepalive periods idle
	checkCodes(t, "after idling", handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	if s := link.Stats(); s.Accepted != 1 {
		t.Fatalf("%d peer connections, want 1: an idle live owner's connection was dropped", s.Accepted)
	}
	if n := rec.count(slog.LevelWarn, "peer unreachable"); n != 0 {
		t.Fatalf("an idle live owner was found unreachable")
	}
}

// TestSilentPeerEpisodeEndsAtHeal blackholes the peer link long enough
// for the reconnection backoff to reach its cap, heals it, and measures
// how long requests keep failing: a reconnection that was accepted but
// whose keepalive went unanswered is followed by the next one at once, so
// one always waits for an answer and the heal ends the episode within a
// round trip, whatever the phase of the heal (with a backoff after every
// silent reconnection the relay would fail requests for up to 1s more,
// about 80% of the time with this keepalive).
func TestSilentPeerEpisodeEndsAtHeal(t *testing.T) {
	b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
	ps := startPeerServer(t, "127.0.0.1:0", b, nil)
	link, err := faultnet.Listen(ps.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	r := NewRouter(RouterConfig{Locator: newTestLocator("a", map[string]string{"b": link.Addr()}),
		RelayTimeout: 600 * time.Millisecond, WaitForOwner: 100 * time.Millisecond, Logger: slog.New(&logRecorder{})})
	t.Cleanup(r.Close)
	hb := func() int16 { return codesOf(t, handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")))[0] }
	for round := range 3 {
		if c := hb(); c != markerB {
			t.Fatalf("round %d before the fault: code %d", round, c)
		}
		link.Blackhole(faultnet.Both)
		time.Sleep(4*time.Second + time.Duration(round)*300*time.Millisecond)
		if c := hb(); c != codeUnavailable {
			t.Fatalf("round %d during the fault: code %d", round, c)
		}
		link.Heal()
		healed := time.Now()
		waitFor(t, 5*time.Second, "B answering after heal", func() bool { return hb() == markerB })
		took := time.Since(healed)
		t.Logf("round %d: requests reach B again %v after heal", round, took)
		if took > 200*time.Millisecond {
			t.Fatalf("round %d: requests failed for %v after heal; want within 200ms", round, took)
		}
	}
}

// TestJoinWaitsForSilentPeer: while the owner is in an unreachable
// episode, a member's heartbeat fails at once, and so does the JoinGroup
// of a member that has a member id, but the JoinGroup of a member
// joining afresh waits for the owner and is answered by it the moment the
// link heals, as a direct member's join held in TCP would be.
func TestJoinWaitsForSilentPeer(t *testing.T) {
	b := &fakeEngine{name: "B", prefix: "b", marker: markerB}
	ps := startPeerServer(t, "127.0.0.1:0", b, nil)
	link, err := faultnet.Listen(ps.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	r := NewRouter(RouterConfig{Locator: newTestLocator("a", map[string]string{"b": link.Addr()}),
		RelayTimeout: 600 * time.Millisecond, WaitForOwner: 100 * time.Millisecond, Logger: slog.New(&logRecorder{})})
	t.Cleanup(r.Close)
	join := func(member string) *kmsg.JoinGroupRequest {
		j := kmsg.NewPtrJoinGroupRequest()
		j.Version = 5
		j.Group, j.MemberID, j.ProtocolType, j.RebalanceTimeoutMillis, j.SessionTimeoutMillis = "b-group", member, "consumer", 10000, 10000
		j.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1}}}
		return j
	}
	checkCodes(t, "before the fault", handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")), markerB)
	link.Blackhole(faultnet.Both)
	waitFor(t, 5*time.Second, "the episode", func() bool {
		return codesOf(t, handle(t, r, Client{ID: "c"}, heartbeatFor("b-group", "m")))[0] == codeUnavailable
	})
	start := time.Now()
	checkCodes(t, "a known member's join during the episode", handle(t, r, Client{ID: "c"}, join("m")), codeUnavailable)
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Fatalf("a known member's join waited %v", took)
	}
	held := handleAsync(r, Client{ID: "c"}, join(""))
	time.Sleep(time.Second)
	select {
	case resp := <-held:
		t.Fatalf("a fresh join was answered during the episode: %v", codesOf(t, resp))
	default:
	}
	link.Heal()
	healed := time.Now()
	checkCodes(t, "the fresh join after heal", waitReply(t, held, 5*time.Second), markerB)
	if took := time.Since(healed); took > 300*time.Millisecond {
		t.Fatalf("the held join was answered %v after heal; want at once", took)
	}
}
