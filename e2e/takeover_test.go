package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestTakeOverLiveGroup: adoption completed. The members of a group the
// cluster coordinates move behind kproxy one at a time; while any is
// direct the group is forwarded, and once every member is behind kproxy
// and the cluster's group is Stable kproxy takes it over without a
// rebalance: the engine holds it at the cluster's generation with the
// same members and assignments (each member's generation never changes,
// no partition changes hands), the cluster's group holds kproxy's anchor
// instead of the members, consumption and commits go on, committed
// offsets never go backwards and nothing is lost. Eager and cooperative.
func TestTakeOverLiveGroup(t *testing.T) {
	t.Parallel()
	for _, balancer := range []string{"eager", "cooperative"} {
		t.Run(balancer, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := newStack(t)
			group, topic := "takeover-"+balancer, "takeover-t-"+balancer
			const n = 900
			s.produce(ctx, topic, 4, n/3)
			opts := []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}
			if balancer == "eager" {
				opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
			}
			own, recs := newOwnership(t), newRecords()
			watch := watchOffsets(ctx, t, s.cluster.ListenAddrs(), topic, group)
			mc := func() memberCfg { return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts} }
			direct := s.cluster.ListenAddrs()[0]
			a := startMemberAt(t, direct, "a-direct", mc())
			b := startMemberAt(t, direct, "b-direct", mc())
			waitOwners(t, own, 4, "a-direct", "b-direct")
			adm := directAdmin(t, s)

			// a moves behind kproxy: forwarded, one group with b.
			a.leave()
			own.releaseAll("a-direct")
			a2 := s.startMember("a", mc())
			waitOwners(t, own, 4, "a", "b-direct")
			s.produceRange(ctx, topic, n/3, 2*n/3)

			// b moves too: every member is behind kproxy.
			b.leave()
			own.releaseAll("b-direct")
			b2 := s.startMember("b", mc())
			waitOwners(t, own, 4, "a", "b")

			// kproxy takes the group over: the cluster's group holds the
			// anchor alone, the engine the two members.
			d := waitDirectWithin(ctx, t, adm, group, "anchored by kproxy", 30*time.Second, func(d kadm.DescribedGroup) bool {
				return len(d.Members) == 1 && d.Members[0].InstanceID != nil && d.State == "Stable"
			})
			t.Logf("cluster's group after the takeover: %s, member %s (instance %s)", d.State, d.Members[0].MemberID, *d.Members[0].InstanceID)
			_, genA := a2.cl.GroupMetadata()
			_, genB := b2.cl.GroupMetadata()
			snap := engineGroup(t, s, group)
			if len(snap.Members) != 2 || snap.State != "Stable" || snap.Generation != genA || genA != genB {
				t.Fatalf("after the takeover the engine holds %s gen %d with %d members; the members are at generations %d and %d",
					snap.State, snap.Generation, len(snap.Members), genA, genB)
			}
			before := own.owners()

			// Nothing rebalances after it: consumption and commits go on
			// at the same generation.
			s.produceRange(ctx, topic, 2*n/3, n)
			deadline := time.Now().Add(30 * time.Second)
			for recs.distinct() < n && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if miss := recs.missing(n); len(miss) > 0 {
				t.Fatalf("%d records never consumed, first %v", len(miss), miss[:min(5, len(miss))])
			}
			time.Sleep(2 * time.Second) // a rebalance, if any, shows by now
			if _, g := a2.cl.GroupMetadata(); g != genA {
				t.Fatalf("member a went from generation %d to %d after the takeover", genA, g)
			}
			if _, g := b2.cl.GroupMetadata(); g != genB {
				t.Fatalf("member b went from generation %d to %d after the takeover", genB, g)
			}
			if after := own.owners(); !sameOwners(before, after) {
				t.Fatalf("partitions changed hands after the takeover: %v, then %v", before, after)
			}
			if got := s.brokerGroupReqs[11].Load(); got > 0 {
				t.Logf("JoinGroups the cluster saw from members (before the takeover): %d", got)
			}
			a2.leave()
			b2.leave()
			own.check()
			watch.check(t)
			s.assertCommittedAtEnd(ctx, group, topic)
		})
	}
}

// waitDirectWithin is waitDirect with a deadline of its own.
func waitDirectWithin(ctx context.Context, t testing.TB, adm *kadm.Client, group, what string, within time.Duration, ok func(kadm.DescribedGroup) bool) kadm.DescribedGroup {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		d := describeDirect(ctx, t, adm, group)
		if ok(d) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s never became %s on the cluster: state %s, members %+v", group, what, d.State, d.Members)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// engineGroup returns the engine's snapshot of group.
func engineGroup(t testing.TB, s *stack, group string) groupstate.GroupSnapshot {
	t.Helper()
	for _, g := range s.engine.Groups() {
		if g.Group == group {
			return g
		}
	}
	t.Fatalf("the engine does not hold group %s", group)
	return groupstate.GroupSnapshot{}
}

// sameOwners reports whether two ownership maps are equal.
func sameOwners(a, b map[string][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for m, ps := range a {
		qs := b[m]
		if len(ps) != len(qs) {
			return false
		}
		for i := range ps {
			if ps[i] != qs[i] {
				return false
			}
		}
	}
	return true
}

// TestTakeOverLiveGroupFleet: the same adoption with one sidecar per
// member, in a fleet: three direct members move one at a time onto three
// relays while a fourth kproxy owns every groups partition, so only the
// relays' reports tell the owner about the members. Once the last one is
// behind kproxy the owner takes the group over without a rebalance. Then
// the owner stops and another takes its partitions: the group taken over
// was written to the groups topic, so the members go on at the same
// generation there too.
func TestTakeOverLiveGroupFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const group, topic, n = "takeover-fleet", "takeover-fleet-t", 900
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	fc := kproxy.FleetConfig{Name: "takeover"}
	owner := startFleetKproxy(t, brokers, fc)
	fc.Relay = true
	relays := []*kproxy.Server{startFleetKproxy(t, brokers, fc), startFleetKproxy(t, brokers, fc), startFleetKproxy(t, brokers, fc)}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			prod.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, nil)
		}
		if err := prod.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, n/3)
	opts := []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}
	own, recs := newOwnership(t), newRecords()
	watch := watchOffsets(ctx, t, brokers, topic, group)
	mc := func() memberCfg { return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts} }
	names := []string{"a", "b", "c"}
	var direct []*member
	for _, name := range names {
		direct = append(direct, startMemberAt(t, brokers[0], name+"-direct", mc()))
	}
	waitOwners(t, own, 6, "a-direct", "b-direct", "c-direct")
	sidecars := relays
	var behind []*member
	for i, name := range names {
		direct[i].leave()
		own.releaseAll(name + "-direct")
		behind = append(behind, startMemberAt(t, sidecars[i].Addr(), name, mc()))
		want := []string{}
		for j := range names {
			if j <= i {
				want = append(want, names[j])
			} else {
				want = append(want, names[j]+"-direct")
			}
		}
		waitOwners(t, own, 6, want...)
		produce(n/3+i*n/9, n/3+(i+1)*n/9)
	}
	defer func() {
		for _, m := range behind {
			m.leave()
		}
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	waitDirectWithin(ctx, t, adm, group, "anchored by kproxy", 30*time.Second, func(d kadm.DescribedGroup) bool {
		return len(d.Members) == 1 && d.Members[0].InstanceID != nil && d.State == "Stable"
	})
	gens := generations(behind)
	var snap groupstate.GroupSnapshot
	for _, g := range owner.Engine().Groups() {
		if g.Group == group {
			snap = g
		}
	}
	if len(snap.Members) != 3 || snap.State != "Stable" || snap.Generation != gens[0] || gens[0] != gens[1] || gens[1] != gens[2] {
		t.Fatalf("after the takeover the owner's engine holds %s gen %d with %d members; the members are at generations %v",
			snap.State, snap.Generation, len(snap.Members), gens)
	}
	before := own.owners()
	produce(2*n/3, n)
	waitConsumed(t, recs, n)
	time.Sleep(2 * time.Second)
	if now := generations(behind); !slices.Equal(now, gens) {
		t.Fatalf("the members' generations went from %v to %v after the takeover", gens, now)
	}
	if after := own.owners(); !sameOwners(before, after) {
		t.Fatalf("partitions changed hands after the takeover: %v, then %v", before, after)
	}

	// Failover: a second owner starts, the first stops; the group's
	// record moves with its partition.
	next := startFleetKproxy(t, brokers, kproxy.FleetConfig{Name: "takeover"})
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	if err := owner.Shutdown(sctx); err != nil {
		t.Logf("first owner's shutdown: %v", err)
	}
	scancel()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got groupstate.GroupSnapshot
		for _, g := range next.Engine().Groups() {
			if g.Group == group {
				got = g
			}
		}
		if len(got.Members) == 3 {
			if got.Generation != gens[0] {
				t.Fatalf("the next owner holds the group at generation %d, the members were at %d", got.Generation, gens[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next owner never served the group with its 3 members: %+v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if now := generations(behind); !slices.Equal(now, gens) {
		t.Fatalf("the members' generations went from %v to %v after the failover", gens, now)
	}
	own.check()
	watch.check(t)
}
