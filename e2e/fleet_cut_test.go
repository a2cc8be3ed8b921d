package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// This file measures the window of double ownership when a kproxy cannot
// reach a group's owner (issue 20, docs/fleet.md "When the network
// misbehaves"): KIP-848 members behind a relay whose peer link into the
// owner is cut, and the members of a kproxy that owns their group and is
// cut off from the cluster (its fleet lease runs out and another kproxy
// takes the group over). fleet_cutoff_test.go does the first for classic
// members.

// cutSession is the members' session timeout in this file's tests: the
// classic members' own (kgo.SessionTimeout) and the KIP-848 members'
// (group.consumer.session.timeout.ms, on kfake and on every kproxy).
// Longer than the fleet's 3s session plus a claim, so that a group moved
// to a new owner is served there well before its members' sessions could
// have run out.
const cutSession = 6 * time.Second

// cutClusterConfigs are the KIP-848 settings of the direct groups (kfake
// serves them); the kproxies get the same explicitly.
var cutClusterConfigs = map[string]string{
	"group.consumer.session.timeout.ms":    fmt.Sprint(cutSession.Milliseconds()),
	"group.consumer.heartbeat.interval.ms": "300",
}

// startCutFleetKproxy starts an in-process kproxy of a fleet whose every
// connection to the cluster (its own client's and its clients' forwarded
// traffic) goes through path when path is not nil; KIP-848 sessions of
// cutSession and short fleet timers.
func startCutFleetKproxy(t testing.TB, brokers []string, fc kproxy.FleetConfig, path *faultPath) *kproxy.Server {
	t.Helper()
	fc.SessionTimeout, fc.HeartbeatInterval = 3*time.Second, 300*time.Millisecond
	return startFailoverKproxy(t, brokers, fc, cutSession, path)
}

// kip848Member asks startFaultMember for a KIP-848 member (server-side
// assignment) with the session of this file's tests.
var kip848Member = []kgo.Opt{kgo.ServerSideBalancer()}

// checkSpeaksKIP848 fails the test for every member whose client did not
// manage its group with the KIP-848 protocol (franz-go falls back to the
// classic protocol silently when ConsumerGroupHeartbeat is not served).
func checkSpeaksKIP848(t testing.TB, members ...*faultMember) {
	t.Helper()
	for _, m := range members {
		if !strings.Contains(m.log.String(), "beginning to manage the next-gen group lifecycle") {
			t.Errorf("%s did not speak the KIP-848 protocol", m.name)
		}
	}
}

// doubleOwnership is member m's window of double ownership in a fault
// from faultAt to healAt: the worst, over the partitions m owned when
// the fault began that another member of its group (others) was given
// during the fault, of the time from that OnPartitionsAssigned to m's
// own OnPartitionsLost or OnPartitionsRevoked; negative when m gave the
// partition up first. given counts those partitions.
func doubleOwnership(t testing.TB, m *faultMember, faultAt, healAt time.Time, others ...*faultMember) (worst time.Duration, given int) {
	t.Helper()
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

// windowCase is one cut-off member whose window is measured: others are
// the members of its group that may be given its partitions; bound
// says the window must be negative.
type windowCase struct {
	m      *faultMember
	others []*faultMember
	bound  bool
}

// checkWindows measures and logs each case's window and fails the test
// for a bound one that is not negative, or one none of whose partitions
// moved during the fault.
func checkWindows(t testing.TB, what string, faultAt, healAt time.Time, cases ...windowCase) {
	t.Helper()
	for _, c := range cases {
		worst, given := doubleOwnership(t, c.m, faultAt, healAt, c.others...)
		if given == 0 {
			t.Errorf("%s: none of its partitions was given to another member during the %v fault", c.m.name, healAt.Sub(faultAt).Round(time.Second))
			continue
		}
		t.Logf("%-10s window of double ownership %+6.2fs (worst of %d partitions; %s)", c.m.name, worst.Seconds(), given, what)
		if c.bound && worst > 0 {
			t.Errorf("%s: kept partitions %v after they were given away; want it to give them up first", c.m.name, worst)
			l := c.m.log.String()
			t.Logf("%s log tail:\n%s", c.m.name, l[max(0, len(l)-5000):])
		}
	}
}

// setupWatch records a client's stuck connection setups: an ApiVersions
// request that failed or took over 2s. A kproxy cut off from the cluster
// answers a new connection's ApiVersions from the brokers' last known
// versions within its api_versions_timeout (1s), so that a member whose
// client opens a new connection to it (franz-go looks its coordinator up
// on any broker after COORDINATOR_NOT_AVAILABLE) still hears the router.
// A kgo hook (HookBrokerRead).
type setupWatch struct {
	mu    sync.Mutex
	stuck [][2]time.Time // guarded by mu: when each stuck setup began and ended
}

func (w *setupWatch) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, timeToRead time.Duration, err error) {
	if key == 18 && (err != nil || timeToRead > 2*time.Second) {
		now := time.Now()
		w.mu.Lock()
		w.stuck = append(w.stuck, [2]time.Time{now.Add(-timeToRead), now})
		w.mu.Unlock()
	}
}

// stuckIn counts the stuck setups that began within [from, to).
func (w *setupWatch) stuckIn(from, to time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.stuck {
		if !s[0].Before(from) && s[0].Before(to) {
			n++
		}
	}
	return n
}

// TestFleetPeerLinkCutKIP848MembersGiveUp is TestFleetPeerLinkCutMembersGiveUp
// for KIP-848 members: the peer link into the owner of a fleet of two
// in-process kproxies over kfake is blackholed for 12s, and the window
// of double ownership of a franz-go KIP-848 member behind the relaying
// kproxy is measured from the members' callbacks, beside a direct
// KIP-848 group on kfake whose member's own path is blackholed the same
// way, in the same run. franz-go's KIP-848 member retries a heartbeat
// that failed with a coordinator error for good, keeping its partitions,
// so without being told (relay_keeps_members, and directly) it keeps
// them until heal; with the relay telling (relay_tells_members) the
// window must be negative. Both assert that nothing acknowledged is
// lost, offsets never go backwards, every record is consumed and every
// member commits again after heal.
func TestFleetPeerLinkCutKIP848MembersGiveUp(t *testing.T) {
	t.Run("relay_tells_members", func(t *testing.T) { cutOffKIP848Members(t, false) })
	t.Run("relay_keeps_members", func(t *testing.T) { cutOffKIP848Members(t, true) })
}

func cutOffKIP848Members(t *testing.T, keep bool) {
	const topic, partitions = "cutoff848", 6
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(partitions, topic), kfake.BrokerConfigs(cutClusterConfigs))
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
	owner := startCutFleetKproxy(t, brokers, kproxy.FleetConfig{PeerListen: ownerPeer, PeerAdvertise: link.Addr()}, nil)
	relay := startCutFleetKproxy(t, brokers, kproxy.FleetConfig{Relay: true, KeepCutOffMembers: keep}, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const viaGroup, directGroup = "cutoff848-kproxy", "cutoff848-direct"
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
	path := newFaultPath(t)
	ownerMember := startFaultMember(t, ctx, "k-owner", viaGroup, topic, []string{owner.Addr()}, nil, seen[viaGroup], &seenMu, kip848Member...)
	cut := startFaultMember(t, ctx, "k-cut", viaGroup, topic, []string{relay.Addr()}, nil, seen[viaGroup], &seenMu, kip848Member...)
	directHealthy := startFaultMember(t, ctx, "d-healthy", directGroup, topic, brokers, nil, seen[directGroup], &seenMu, kip848Member...)
	directCut := startFaultMember(t, ctx, "d-cut", directGroup, topic, brokers, path.dial, seen[directGroup], &seenMu, kip848Member...)
	via := []*faultMember{ownerMember, cut}
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
	checkSpeaksKIP848(t, all...)
	time.Sleep(2 * time.Second) // steady state

	const faultFor = 12 * time.Second
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
	checkWindows(t, fmt.Sprintf("relay keeps cut-off members: %v", keep), faultAt, healAt,
		windowCase{cut, []*faultMember{ownerMember}, !keep},
		windowCase{directCut, []*faultMember{directHealthy}, false})
	cancel()
}

// fleetServing is what k's /api/fleet says it serves, and whether it
// answered with a settled membership.
func fleetServing(k *kproxy.Server) ([]int32, bool) {
	v, ok := commitBenchFleetView(k)
	if !ok || v.Member.Joining || !v.LeaseValid {
		return nil, false
	}
	return v.Serving, true
}

// groupOn is the first group name prefix-N whose groups-topic partition
// is in serving.
func groupOn(prefix string, serving []int32) string {
	for i := 0; ; i++ {
		g := fmt.Sprintf("%s-%d", prefix, i)
		if slices.Contains(serving, kafkastore.GroupPartition(g, fleetPartitions)) {
			return g
		}
	}
}

// TestFleetOwnerCutFromClusterMembersGiveUp cuts the owner of two groups
// (one classic, one KIP-848) off from the cluster for 16s: a fleet of two
// in-process kproxies over kfake, A and B; every connection of A to the
// brokers (its own client's and its clients' forwarded traffic) goes
// through a fault relay, which blackholes them both ways. A's fleet lease
// runs out, the brokers expel it from the fleet, B claims A's partitions
// and loads the groups with fresh session timers, and once the members
// connected to A have not heartbeated for their session, B expires them
// and gives their partitions to the members connected to B. A cannot
// tell its members about B (it does not know the new table), so without
// being told (a_keeps_members, KeepCutOffMembers) they keep their
// partitions until heal: double ownership for the rest of the fault. With
// A's router telling them (a_tells_members) their window of double
// ownership, from the members' own callbacks, must be negative. Beside
// them, in the same run, a direct classic and a direct KIP-848 group on
// kfake whose cut members' own paths are blackholed the same way. Both
// assert that nothing acknowledged is lost, offsets never go backwards,
// every record is consumed and every member commits again after heal.
func TestFleetOwnerCutFromClusterMembersGiveUp(t *testing.T) {
	t.Run("a_tells_members", func(t *testing.T) { ownerCutFromCluster(t, false) })
	t.Run("a_keeps_members", func(t *testing.T) { ownerCutFromCluster(t, true) })
}

func ownerCutFromCluster(t *testing.T, keep bool) {
	const topic, partitions = "ownercut", 6
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(partitions, topic), kfake.BrokerConfigs(cutClusterConfigs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	// A alone first, so that it owns every partition; then B, which
	// takes about half of them.
	pathA := newFaultPath(t)
	a := startCutFleetKproxy(t, brokers, kproxy.FleetConfig{KeepCutOffMembers: keep}, pathA)
	waitUntil(t, 60*time.Second, "A to serve every partition", func() bool {
		s, ok := fleetServing(a)
		return ok && len(s) == fleetPartitions
	})
	b := startCutFleetKproxy(t, brokers, kproxy.FleetConfig{}, nil)
	var servedByA []int32
	waitUntil(t, 60*time.Second, "A and B to share the partitions", func() bool {
		sa, okA := fleetServing(a)
		sb, okB := fleetServing(b)
		servedByA = sa
		return okA && okB && len(sa) > 0 && len(sb) > 0 && len(sa)+len(sb) == fleetPartitions
	})
	classicGroup, kipGroup := groupOn("ownercut-classic", servedByA), groupOn("ownercut-848", servedByA)
	const directClassic, directKIP = "ownercut-classic-direct", "ownercut-848-direct"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// B knows A as the owner of both groups once it relays to it.
	waitUntil(t, 60*time.Second, "B to reach A", func() bool {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for _, g := range []string{classicGroup, kipGroup} {
			offs, err := kadm.NewClient(cl).FetchOffsets(ctx, g)
			if err != nil || offs.Error() != nil {
				return false
			}
		}
		return true
	})

	prod, _, stopProducing := startSteadyProducer(ctx, t, brokers, topic)
	groups := []string{classicGroup, kipGroup, directClassic, directKIP}
	seen := map[string]map[int32]map[int64]bool{}
	for _, g := range groups {
		seen[g] = map[int32]map[int64]bool{}
	}
	var seenMu sync.Mutex
	watch := watchOffsets(ctx, t, brokers, topic, groups...)
	// The classic members retry for 30s, as Kafka's consumer keeps its
	// partitions while its coordinator is unknown.
	classic := []kgo.Opt{kgo.RetryTimeout(30 * time.Second), kgo.SessionTimeout(cutSession)}
	pathC, pathK := newFaultPath(t), newFaultPath(t)
	member := func(name, group string, seeds []string, dial func(context.Context, string, string) (net.Conn, error), opts []kgo.Opt) *faultMember {
		return startFaultMember(t, ctx, name, group, topic, seeds, dial, seen[group], &seenMu, opts...)
	}
	watchA, watch848A := &setupWatch{}, &setupWatch{}
	cA := member("c-on-a", classicGroup, []string{a.Addr()}, nil, append(slices.Clone(classic), kgo.WithHooks(watchA)))
	cB := member("c-on-b", classicGroup, []string{b.Addr()}, nil, classic)
	nA := member("k848-on-a", kipGroup, []string{a.Addr()}, nil, append(slices.Clone(kip848Member), kgo.WithHooks(watch848A)))
	nB := member("k848-on-b", kipGroup, []string{b.Addr()}, nil, kip848Member)
	dcHealthy := member("dc-healthy", directClassic, brokers, nil, classic)
	dcCut := member("dc-cut", directClassic, brokers, pathC.dial, classic)
	dkHealthy := member("dk-healthy", directKIP, brokers, nil, kip848Member)
	dkCut := member("dk-cut", directKIP, brokers, pathK.dial, kip848Member)
	all := []*faultMember{cA, cB, nA, nB, dcHealthy, dcCut, dkHealthy, dkCut}
	waitUntil(t, 90*time.Second, "every member to own a partition and commit", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(time.Time{}); !ok || m.assigned.Load() == 0 {
				return false
			}
		}
		return true
	})
	checkSpeaksKIP848(t, nA, nB, dkHealthy, dkCut)
	if s, ok := fleetServing(a); !ok || !slices.Contains(s, kafkastore.GroupPartition(classicGroup, fleetPartitions)) ||
		!slices.Contains(s, kafkastore.GroupPartition(kipGroup, fleetPartitions)) {
		t.Fatalf("A no longer serves the groups' partitions (serves %v)", s)
	}
	time.Sleep(2 * time.Second) // steady state

	const faultFor = 16 * time.Second
	blackhole := func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) }
	faultAt := time.Now()
	pathA.apply(blackhole)
	pathC.apply(blackhole)
	pathK.apply(blackhole)
	time.Sleep(faultFor)
	healAt := time.Now()
	pathA.apply(nil)
	pathC.apply(nil)
	pathK.apply(nil)

	waitUntil(t, 90*time.Second, "every member to own a partition and commit after heal", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(healAt); !ok || m.assigned.Load() == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second)
	stopProducing()
	checkConsumedAndKept(t, ctx, prod, topic, map[string][]*faultMember{
		classicGroup: {cA, cB}, kipGroup: {nA, nB}, directClassic: {dcHealthy, dcCut}, directKIP: {dkHealthy, dkCut},
	}, seen, &seenMu)
	watch.check(t)
	checkRetriableOnly(t, all)
	// A member whose client opened a new connection to A during the
	// fault is answered its ApiVersions from A's last known versions
	// within api_versions_timeout, so A's answers reach it: no setup may
	// be stuck (it was, before: kproxy only forwarded ApiVersions to the
	// unreachable brokers).
	for _, w := range []struct {
		name  string
		watch *setupWatch
	}{{cA.name, watchA}, {nA.name, watch848A}} {
		if n := w.watch.stuckIn(faultAt, healAt); n > 0 {
			t.Errorf("%s: %d ApiVersions on a new connection to A went unanswered for over 2s during the fault", w.name, n)
		}
	}
	checkWindows(t, fmt.Sprintf("A keeps its members: %v", keep), faultAt, healAt,
		windowCase{cA, []*faultMember{cB}, !keep},
		windowCase{nA, []*faultMember{nB}, !keep},
		windowCase{dcCut, []*faultMember{dcHealthy}, false},
		windowCase{dkCut, []*faultMember{dkHealthy}, false})
	cancel()
}
