package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTakeOverLiveKIP848Group: adoption of a KIP-848 group (franz-go
// members, consumer group protocol, server-side assignment) on kfake,
// which serves KIP-848 groups itself. Two members move from the brokers
// behind kproxy one at a time; while one is direct the group is
// forwarded. Once both are behind kproxy and the cluster's group is
// stable, kproxy takes it over: the engine holds it at the cluster's
// epoch, the members' epochs and partitions never change across the
// takeover (sampled every few milliseconds from the clients), the
// cluster's group then holds kproxy's anchor alone, every record is
// consumed, no partition is owned by two members at any instant (from the
// members' callbacks), and committed offsets never go backwards. The
// commits after the takeover are the interop row's (see the end).
func TestTakeOverLiveKIP848Group(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newStack(t, kip848Opts)
	const group, topic, n, parts = "takeover-848", "takeover-848-t", 900, 4
	s.produce(ctx, topic, parts, n/3)
	own, recs := newOwnership(t), newRecords()
	watch := watchOffsets(ctx, t, s.cluster.ListenAddrs(), topic, group)
	mc := memberCfg{group: group, topic: topic, own: own, recs: recs,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}}
	direct := s.cluster.ListenAddrs()[0]
	a := startMemberAt(t, direct, "a-direct", mc)
	b := startMemberAt(t, direct, "b-direct", mc)
	waitOwners(t, own, parts, "a-direct", "b-direct")
	adm := directAdmin(t, s)

	a.leave()
	own.releaseAll("a-direct")
	a2 := s.startMember("a", mc)
	waitOwners(t, own, parts, "a", "b-direct")
	if _, ok := s.engine.Group(group); ok {
		t.Fatal("the engine serves the group while a member is still direct")
	}
	s.produceRange(ctx, topic, n/3, 2*n/3)

	b.leave()
	own.releaseAll("b-direct")
	b2 := s.startMember("b", mc)
	moved := time.Now()

	// Sample both members' epochs and the owners until the engine holds
	// the group and for 3 s after.
	smp := &epochSampler{members: []*member{a2, b2}, own: own}
	go smp.run(ctx, s, group)
	d := waitDirectWithin(ctx, t, adm, group, "anchored by kproxy", 45*time.Second, func(d kadm.DescribedGroup) bool {
		return len(d.Members) == 1 && d.Members[0].InstanceID != nil && d.State == "Stable"
	})
	t.Logf("taken over %v after the last move; the cluster's group: %s %s, member %s (instance %s)",
		smp.takenAt().Sub(moved).Round(time.Millisecond), d.State, d.ProtocolType, d.Members[0].MemberID, *d.Members[0].InstanceID)
	s.produceRange(ctx, topic, 2*n/3, n)
	deadline := time.Now().Add(30 * time.Second)
	for recs.distinct() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if miss := recs.missing(n); len(miss) > 0 {
		t.Fatalf("%d records never consumed, first %v", len(miss), miss[:min(5, len(miss))])
	}
	time.Sleep(2 * time.Second) // a revocation or new epoch, if any, shows by now
	smp.stop()
	smp.check(t)
	snap := engineGroup(t, s, group)
	_, ea := a2.cl.GroupMetadata()
	_, eb := b2.cl.GroupMetadata()
	if snap.ProtocolType != "consumer" || len(snap.Members) != 2 || snap.Generation != ea || ea != eb {
		t.Fatalf("after the takeover the engine holds %s epoch %d with %d members; the members are at epochs %d and %d",
			snap.ProtocolType, snap.Generation, len(snap.Members), ea, eb)
	}
	a2.leave()
	b2.leave()
	own.check()
	watch.check(t)
	// Not checked here: that the commits after the takeover reach the
	// cluster. kfake keeps an empty consumer group a consumer group when
	// a classic member (the anchor) joins it, where Kafka 4.x converts it
	// into a classic group (GroupMetadataManager.classicGroupJoinToClassicGroup,
	// maybeDeleteEmptyConsumerGroup), so kfake refuses the anchor's
	// commits with UNKNOWN_MEMBER_ID. The interop row
	// franz-kip848-adoption checks them on Kafka 4.1.1.
}

// epochSampler samples members' epochs and the partitions' owners, and
// notes when the engine first holds the group with members. Owned by its
// run goroutine but for mu.
type epochSampler struct {
	members []*member     // immutable
	own     *ownership    // immutable
	mu      sync.Mutex    // guards what follows
	samples []epochSample // in time order
	taken   time.Time     // zero until the engine holds the group
	done    chan struct{} // closed when run returns
	quit    chan struct{} // closed by stop
	once    sync.Once     // guards quit's close
}

type epochSample struct {
	at     time.Time
	epochs []int32
	owners map[string][]int32
}

func (e *epochSampler) run(ctx context.Context, s *stack, group string) {
	e.mu.Lock()
	e.done, e.quit = make(chan struct{}), make(chan struct{})
	done, quit := e.done, e.quit
	e.mu.Unlock()
	defer close(done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-quit:
			return
		case <-time.After(5 * time.Millisecond):
		}
		sm := epochSample{at: time.Now(), owners: e.own.owners()}
		for _, m := range e.members {
			_, ep := m.cl.GroupMetadata()
			sm.epochs = append(sm.epochs, ep)
		}
		g, ok := s.engine.Group(group)
		e.mu.Lock()
		if ok && len(g.Members) > 0 && e.taken.IsZero() {
			e.taken = sm.at
		}
		e.samples = append(e.samples, sm)
		e.mu.Unlock()
	}
}

func (e *epochSampler) takenAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.taken
}

func (e *epochSampler) stop() {
	e.mu.Lock()
	quit, done := e.quit, e.done
	e.mu.Unlock()
	if quit == nil {
		return
	}
	e.once.Do(func() { close(quit) })
	<-done
}

// check fails unless every sample from the last one before the engine
// held the group on shows the same epochs and owners, each member
// owning partitions.
func (e *epochSampler) check(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.taken.IsZero() {
		t.Fatal("the engine never held the group")
	}
	var ref *epochSample
	for i := range e.samples {
		sm := &e.samples[i]
		if sm.at.Before(e.taken) {
			ref = sm
			continue
		}
		if ref == nil {
			t.Fatal("no sample before the takeover")
		}
		for j := range sm.epochs {
			if sm.epochs[j] != ref.epochs[j] {
				t.Fatalf("member %s went from epoch %d to %d across the takeover (%v after it)", e.members[j].name, ref.epochs[j], sm.epochs[j], sm.at.Sub(e.taken))
			}
		}
		if !sameOwners(ref.owners, sm.owners) {
			t.Fatalf("partitions changed hands across the takeover: %v, then %v (%v after it)", ref.owners, sm.owners, sm.at.Sub(e.taken))
		}
	}
	if ref == nil || len(ref.owners) != len(e.members) {
		t.Fatalf("at the takeover the owners were %v", ref)
	}
	t.Logf("epochs %v and owners %v unchanged over %d samples after the takeover", ref.epochs, ref.owners, len(e.samples))
}
