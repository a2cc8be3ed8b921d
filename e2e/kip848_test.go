package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// kip848Stack is a stack whose engine runs KIP-848 groups with short
// timeouts, so that a killed member expires within seconds.
func kip848Stack(t *testing.T, opts ...stackOpt) *stack {
	t.Helper()
	s := newStack(t, append([]stackOpt{kip848Opts}, opts...)...)
	// The client only speaks KIP-848 if the proxy advertises
	// ConsumerGroupHeartbeat v1; without it franz-go silently falls back
	// to the classic protocol, which would make this test meaningless.
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), s.client())
	if err != nil {
		t.Fatalf("ApiVersions through kproxy: %v", err)
	}
	advertised := false
	for _, k := range resp.ApiKeys {
		if k.ApiKey == 68 && k.MaxVersion >= 1 {
			advertised = true
		}
	}
	if !advertised {
		t.Fatalf("kproxy does not advertise ConsumerGroupHeartbeat v1: codec/apis.go must route keys 68 and 69 Local")
	}
	return s
}

// TestKIP848GroupLifecycle runs franz-go consumers speaking the KIP-848
// protocol (group.protocol=consumer, server-side assignment) through
// kproxy: scale up to three members, a clean leave, a killed member found
// by the session timeout, and more records; no partition is ever owned by
// two members, no record is lost, and commits reach the end offsets.
func TestKIP848GroupLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
		assignor string
	}{
		{"uniform", kgo.CooperativeStickyBalancer(), "uniform"},
		{"range", kgo.RangeBalancer(), "range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := kip848Stack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const topic, group, parts = "kip848", "kip848-group", 6
			s.produce(ctx, topic, parts, 300)
			own, recs := newOwnership(t), newRecords()
			mc := memberCfg{group: group, topic: topic, own: own, recs: recs,
				opts: []kgo.Opt{kgo.Balancers(tc.balancer), kgo.ServerSideBalancer()}}

			a := s.startMember("a", mc)
			waitOwners(t, own, parts, "a")
			b := s.startMember("b", mc)
			waitOwners(t, own, parts, "a", "b")
			waitConsumed(t, recs, 300)

			snap, ok := s.engine.Group(group)
			if !ok || snap.ProtocolType != "consumer" || snap.Protocol != tc.assignor {
				t.Fatalf("the group is not a KIP-848 group served with %s: %+v (found %v)", tc.assignor, snap, ok)
			}

			c := s.startMember("c", mc) // scale up
			waitOwners(t, own, parts, "a", "b", "c")

			a.leave() // clean leave (epoch -1)
			waitOwners(t, own, parts, "b", "c")

			b.kill(own) // crash: found by the session timeout
			waitOwners(t, own, parts, "c")

			s.produceRange(ctx, topic, 300, 600)
			waitConsumed(t, recs, 600)
			own.check()
			s.assertCommittedAtEnd(ctx, group, topic)
			c.leave()
			s.assertBrokersSawNoGroupTraffic()

			if len(s.eventsOf(groupstate.EventMemberExpired)) == 0 {
				t.Fatalf("no member_expired event for the killed member")
			}
			if len(s.eventsOf(groupstate.EventMemberLeft)) == 0 {
				t.Fatalf("no member_left event")
			}
			if len(s.eventsOf(groupstate.EventAssignmentReconciled)) == 0 {
				t.Fatalf("no assignment_reconciled event")
			}
		})
	}
}

// kip848Opts shortens the KIP-848 timeouts so that a killed member
// expires within seconds.
var kip848Opts = engineOpt(func(c *groupstate.Config) {
	c.ConsumerMinSessionTimeout = time.Second
	c.ConsumerSessionTimeout = 3 * time.Second
	c.ConsumerHeartbeatInterval = 300 * time.Millisecond
	c.TopicRefreshInterval = time.Second
})

// TestKIP848GroupSurvivesProxyRestart restarts kproxy (engine, proxy and
// store client) under a stable KIP-848 group of two franz-go members. The
// engine reloads the group from the upstream cluster: the members go on
// heartbeating with their ids and epochs, the group epoch does not move,
// every partition keeps its owner and no record is lost.
func TestKIP848GroupSurvivesProxyRestart(t *testing.T) {
	s := kip848Stack(t)
	// Move the proxy to a port block whose broker ports survive a
	// restart (as newRestartableStack does for classic groups).
	s.moveToPortBlock()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const topic, group, parts = "kip848-survive", "kip848-survive-group", 4
	s.produce(ctx, topic, parts, 200)
	own, recs := newOwnership(t), newRecords()
	mc := memberCfg{group: group, topic: topic, own: own, recs: recs,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}}
	a := s.startMember("a", mc)
	b := s.startMember("b", mc)
	waitOwners(t, own, parts, "a", "b")
	waitConsumed(t, recs, 200)
	var before groupstate.GroupSnapshot
	for wait := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ok bool
		before, ok = s.engine.Group(group)
		if ok && before.State == "Stable" && before.ProtocolType == "consumer" && len(before.Members) == 2 {
			break
		}
		if time.Now().After(wait) {
			t.Fatalf("the KIP-848 group never became Stable: %+v", before)
		}
	}
	owners := own.owners()
	rebalances := len(s.eventsOf(groupstate.EventRebalanceStarted))

	s.stop()
	s.start()

	s.produceRange(ctx, topic, 200, 400)
	waitConsumed(t, recs, 400)
	for wait := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := s.engine.Group(group); ok {
			break
		}
		if time.Now().After(wait) {
			t.Fatal("the restarted engine never loaded the group")
		}
	}
	// Two session timeouts (3s) pass on the new engine: a member it did
	// not know would have been expired.
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		after, ok := s.engine.Group(group)
		if !ok || after.State != "Stable" || after.Generation != before.Generation || len(after.Members) != 2 {
			t.Fatalf("after the restart: %+v (before: epoch %d)", after, before.Generation)
		}
		time.Sleep(250 * time.Millisecond)
	}
	s.assertRestartInvisible(rebalances, own, owners, recs, 400)
	s.assertCommittedAtEnd(ctx, group, topic)
	a.leave()
	b.leave()
}
