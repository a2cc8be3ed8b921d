package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
)

// TestFranzGroupLifecycle runs a franz-go group through scale up, a clean
// leave, a killed member (session expiry) and more records, with eager and
// cooperative balancers, all served by kproxy's engine.
func TestFranzGroupLifecycle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
	}{
		{"range", kgo.RangeBalancer()},
		{"roundrobin", kgo.RoundRobinBalancer()},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const topic, group, parts = "lifecycle", "lifecycle-group", 6
			s.produce(ctx, topic, parts, 300)
			own, recs := newOwnership(t), newRecords()
			mc := memberCfg{group: group, topic: topic, own: own, recs: recs, opts: []kgo.Opt{kgo.Balancers(tc.balancer)}}

			a := s.startMember("a", mc)
			b := s.startMember("b", mc)
			waitOwners(t, own, parts, "a", "b")
			waitConsumed(t, recs, 300)

			c := s.startMember("c", mc) // scale up
			waitOwners(t, own, parts, "a", "b", "c")

			a.leave() // clean leave
			waitOwners(t, own, parts, "b", "c")

			b.kill(own) // crash: found by session timeout
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
		})
	}
}

// TestFranzStaticMemberRestart restarts a static member (same instance
// id): it takes its place back without a rebalance, and the other member
// keeps its partitions throughout. The restarted member is a follower: a
// restarted franz-go leader recomputes the plan and may itself ask for a
// rebalance (KIP-814), as it would against Kafka.
func TestFranzStaticMemberRestart(t *testing.T) {
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, parts = "static", "static-group", 4
	s.produce(ctx, topic, parts, 100)
	own, recs := newOwnership(t), newRecords()
	mc := func(id string) memberCfg {
		return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: []kgo.Opt{kgo.InstanceID(id), kgo.SessionTimeout(10 * time.Second)}}
	}
	s.startMember("a", mc("instance-a"))
	waitOwners(t, own, parts, "a")
	b := s.startMember("b", mc("instance-b"))
	waitOwners(t, own, parts, "a", "b")
	waitConsumed(t, recs, 100)
	before := len(s.eventsOf(groupstate.EventRebalanceStarted))
	bParts := own.owners()["b"]
	aParts := own.owners()["a"]

	b.leave() // a static member does not send LeaveGroup on close
	own.releaseAll("b")
	s.startMember("b2", mc("instance-b"))
	waitOwners(t, own, parts, "a", "b2")
	if got := own.owners()["b2"]; len(got) != len(bParts) {
		t.Fatalf("restarted instance got %v, had %v", got, bParts)
	}
	if got := own.owners()["a"]; len(got) != len(aParts) {
		t.Fatalf("the other member went from %v to %v", aParts, got)
	}
	if evs := s.eventsOf(groupstate.EventRebalanceStarted); len(evs) != before {
		for _, ev := range evs[before:] {
			t.Logf("rebalance: cause %s member %+v generation %d", ev.Cause, ev.Member, ev.Generation)
		}
		t.Fatalf("static restart caused %d rebalance(s)", len(evs)-before)
	}
	own.check()
	s.assertBrokersSawNoGroupTraffic()
}

// TestOffsetsSurviveProxyRestart commits through one kproxy, restarts it
// (engine and all), and resumes: the group continues from the committed
// offsets, stored in the cluster, and nothing is lost.
func TestOffsetsSurviveProxyRestart(t *testing.T) {
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const topic, group, parts = "restart", "restart-group", 3
	s.produce(ctx, topic, parts, 200)
	own, recs := newOwnership(t), newRecords()
	mc := memberCfg{group: group, topic: topic, own: own, recs: recs}
	m := s.startMember("m", mc)
	waitConsumed(t, recs, 200)
	s.assertCommittedAtEnd(ctx, group, topic)
	m.leave()

	s.stop()
	s.start()

	s.produceRange(ctx, topic, 200, 300)
	again := newRecords()
	m2 := s.startMember("m2", memberCfg{group: group, topic: topic, own: newOwnership(t), recs: again})
	waitConsumed(t, again, 100)
	time.Sleep(300 * time.Millisecond) // let any re-delivery show up
	for i := range 200 {
		if n := again.seen[itoa(i)]; n != 0 {
			t.Fatalf("record %d re-consumed after the restart: offsets were lost", i)
		}
	}
	for i := 200; i < 300; i++ {
		if again.seen[itoa(i)] == 0 {
			t.Fatalf("record %d never consumed after the restart", i)
		}
	}
	m2.leave()
	s.assertCommittedAtEnd(ctx, group, topic)
}
