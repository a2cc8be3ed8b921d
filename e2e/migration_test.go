package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
)

// TestRollingUpgradeClassicToConsumer rolls a group of three franz-go
// classic cooperative-sticky members, one at a time, to the KIP-848
// protocol (kgo.ServerSideBalancer) through kproxy while records flow
// (issue 11): the group converts online when the first KIP-848 member
// joins, the classic members keep consuming inside it, no partition is
// ever owned twice, no record is lost, committed offsets carry over, and
// the group ends as a consumer group of KIP-848 members.
func TestRollingUpgradeClassicToConsumer(t *testing.T) {
	s := kip848Stack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, parts = "roll", "roll-group", 6
	s.produce(ctx, topic, parts, 300)
	own, recs := newOwnership(t), newRecords()
	classic := memberCfg{group: group, topic: topic, own: own, recs: recs,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond)}}
	consumer := memberCfg{group: group, topic: topic, own: own, recs: recs,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}}

	a := s.startMember("a", classic)
	b := s.startMember("b", classic)
	c := s.startMember("c", classic)
	waitOwners(t, own, parts, "a", "b", "c")
	waitConsumed(t, recs, 300)
	if snap, ok := s.engine.Group(group); !ok || snap.ProtocolType != "consumer" || len(snap.Members) != 3 || snap.Members[0].Protocol != groupstate.MemberProtocolClassic {
		t.Fatalf("the starting group is not a classic group of three: %+v", snap)
	}

	a.leave()
	a2 := s.startMember("a2", consumer) // converts the group
	waitOwners(t, own, parts, "b", "c", "a2")
	s.produceRange(ctx, topic, 300, 400)
	waitConsumed(t, recs, 400)
	if len(s.eventsOf(groupstate.EventGroupConverted)) == 0 {
		t.Fatalf("no group_converted event after the first KIP-848 member joined")
	}

	b.leave()
	b2 := s.startMember("b2", consumer)
	waitOwners(t, own, parts, "c", "a2", "b2")
	c.leave()
	c2 := s.startMember("c2", consumer)
	waitOwners(t, own, parts, "a2", "b2", "c2")

	s.produceRange(ctx, topic, 400, 600)
	waitConsumed(t, recs, 600)
	own.check()
	s.assertCommittedAtEnd(ctx, group, topic)
	snap, ok := s.engine.Group(group)
	if !ok || snap.ProtocolType != "consumer" || len(snap.Members) != 3 {
		t.Fatalf("the group did not end as a consumer group of three: %+v", snap)
	}
	for _, m := range snap.Members {
		if m.Protocol != groupstate.MemberProtocolConsumer {
			t.Fatalf("member %s still speaks %s", m.MemberID, m.Protocol)
		}
	}
	for _, m := range []*member{a2, b2, c2} {
		m.leave()
	}
	s.assertBrokersSawNoGroupTraffic()
}
