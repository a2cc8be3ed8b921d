package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestFleetPeerLinkCutMembersGiveUp blackholes the peer link into the
// owner of a fleet of two in-process kproxies over kfake for 10s and
// measures, from the members' own partition callbacks, the window of
// double ownership: from the moment the owner gives a partition of a
// member behind the relaying kproxy to another member
// (OnPartitionsAssigned) until the cut-off member gives it up
// (OnPartitionsLost or OnPartitionsRevoked); negative when the cut-off
// member gives up first. Beside it, in the same run, a direct group whose
// member's own path to the cluster is blackholed the same way.
//
// Behind the relay are two members: one that retries its group requests
// for 30s, which keeps its partitions while its coordinator cannot be
// reached, as Kafka's consumer does, and one with franz-go's default
// retry timeouts (a heartbeat is retried for the session timeout, then
// the member gives its partitions up by itself). With the relay telling
// cut-off members to give up (relay_tells_members) both windows must be
// negative; with it turned off (relay_keeps_members, the behaviour
// without it) the window is only reported. Both assert that nothing
// acknowledged is lost, offsets never go backwards, every record is
// consumed and every member commits again after heal.
func TestFleetPeerLinkCutMembersGiveUp(t *testing.T) {
	t.Run("relay_tells_members", func(t *testing.T) { cutOffMembers(t, false) })
	t.Run("relay_keeps_members", func(t *testing.T) { cutOffMembers(t, true) })
}

func cutOffMembers(t *testing.T, keep bool) {
	const topic, partitions = "cutoff", 6
	const session = 4 * time.Second // startFaultMember's
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.GroupMinSessionTimeout(time.Second), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	ownerPeer := freeAddr(t)
	link, err := faultnet.Listen(ownerPeer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	owner := startFleetKproxy(t, brokers, kproxy.FleetConfig{PeerListen: ownerPeer, PeerAdvertise: link.Addr()})
	relay := startFleetKproxy(t, brokers, kproxy.FleetConfig{Relay: true, KeepCutOffMembers: keep})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const viaGroup, directGroup = "cutoff-kproxy", "cutoff-direct"

	waitUntil(t, 60*time.Second, "the relay to reach the owner", func() bool {
		cl, err := kgo.NewClient(kgo.SeedBrokers(relay.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		offs, err := kadm.NewClient(cl).FetchOffsets(ctx, viaGroup)
		return err == nil && offs.Error() == nil
	})

	prod, _, stopProducing := startSteadyProducer(ctx, t, brokers, topic)

	seen := map[string]map[int32]map[int64]bool{viaGroup: {}, directGroup: {}}
	var seenMu sync.Mutex
	watch := watchOffsets(ctx, t, brokers, topic, viaGroup, directGroup)
	// Retrying for 30s keeps the partitions through the fault; the
	// default retries a heartbeat for the session timeout.
	longRetry := kgo.RetryTimeout(30 * time.Second)
	defaultRetry := kgo.RetryTimeoutFn(func(key int16) time.Duration {
		switch key {
		case 11, 12, 14: // JoinGroup, Heartbeat, SyncGroup: franz-go's default
			return session
		}
		return 30 * time.Second
	})
	path := newFaultPath(t)
	ownerMember := startFaultMember(t, ctx, "k-owner", viaGroup, topic, []string{owner.Addr()}, nil, seen[viaGroup], &seenMu)
	cut := startFaultMember(t, ctx, "k-cut", viaGroup, topic, []string{relay.Addr()}, nil, seen[viaGroup], &seenMu, longRetry)
	cutDefault := startFaultMember(t, ctx, "k-cut-dflt", viaGroup, topic, []string{relay.Addr()}, nil, seen[viaGroup], &seenMu, defaultRetry)
	directHealthy := startFaultMember(t, ctx, "d-healthy", directGroup, topic, brokers, nil, seen[directGroup], &seenMu)
	directCut := startFaultMember(t, ctx, "d-cut", directGroup, topic, brokers, path.dial, seen[directGroup], &seenMu, longRetry)
	via := []*faultMember{ownerMember, cut, cutDefault}
	direct := []*faultMember{directHealthy, directCut}
	all := append(append([]*faultMember{}, via...), direct...)
	waitUntil(t, 60*time.Second, "every member to own a partition and commit", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(time.Time{}); !ok || m.assigned.Load() == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second) // steady state

	const faultFor = 10 * time.Second
	faultAt := time.Now()
	link.Blackhole(faultnet.Both)
	path.apply(func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) })
	time.Sleep(faultFor)
	healAt := time.Now()
	link.Heal()
	path.apply(nil)

	waitUntil(t, 60*time.Second, "every member to own a partition and commit after heal", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(healAt); !ok || m.assigned.Load() == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second)
	stopProducing()
	checkConsumedAndKept(t, ctx, prod, topic, map[string][]*faultMember{viaGroup: via, directGroup: direct}, seen, &seenMu)
	watch.check(t)
	checkRetriableOnly(t, all)

	// The window of double ownership of each cut-off member: the worst
	// over the partitions it owned when the fault began that another
	// member of its group was given during the fault.
	window := func(m *faultMember, others ...*faultMember) (worst time.Duration, given int) {
		worst = -time.Hour
		for p := range m.ownedAt(faultAt) {
			var to partEvent
			for _, o := range others {
				if e, ok := o.firstEvent(faultAt, p, "assigned"); ok && (to.at.IsZero() || e.at.Before(to.at)) {
					to = e
				}
			}
			if to.at.IsZero() || !to.at.Before(healAt) {
				continue // not given away during the fault
			}
			given++
			lost, ok := m.firstEvent(faultAt, p, "lost", "revoked")
			if !ok {
				t.Errorf("%s never gave up partition %d, given to another member %v into the fault", m.name, p, to.at.Sub(faultAt).Round(time.Millisecond))
				continue
			}
			w := lost.at.Sub(to.at)
			t.Logf("%-10s partition %d: given to another member %5.2fs into the fault, %s here %5.2fs in: window %+6.2fs",
				m.name, p, to.at.Sub(faultAt).Seconds(), lost.kind, lost.at.Sub(faultAt).Seconds(), w.Seconds())
			worst = max(worst, w)
		}
		return worst, given
	}
	for _, c := range []struct {
		m      *faultMember
		others []*faultMember
		bound  bool // the window must be negative
	}{
		{cut, []*faultMember{ownerMember, cutDefault}, !keep},
		{cutDefault, []*faultMember{ownerMember, cut}, !keep},
		{directCut, []*faultMember{directHealthy}, false},
	} {
		worst, given := window(c.m, c.others...)
		if given == 0 {
			t.Errorf("%s: none of its partitions was given to another member during the %v fault", c.m.name, faultFor)
			continue
		}
		t.Logf("%-10s window of double ownership %+6.2fs (worst of %d partitions; relay keeps cut-off members: %v)", c.m.name, worst.Seconds(), given, keep)
		if c.bound && worst > 0 {
			t.Errorf("%s: kept partitions %v after the owner gave them away; want it to give them up first", c.m.name, worst)
		}
	}
	cancel()
}
