package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestFleetFailoverWithinDetection measures what a healthy member pays
// when its group's owner loses the brokers (docs/fleet.md, "Failover,
// part by part"): a fleet of two in-process kproxies over kfake, A and
// B; A owns a classic group and a KIP-848 group whose members are all
// connected to B, and A's every connection to the cluster is blackholed
// both ways. B's members must commit again within the fleet's detection
// time plus 1s of their last commit before the fault. The detection time
// is the fleet session plus a fleet heartbeat interval: the brokers
// expel A a session after the last heartbeat they received from it, and
// the other kproxies learn it at their next heartbeat. Beside them, in
// the same run, a direct group on kfake (whose coordinator the fault
// does not touch). Asserts, besides the bound, that no partition is
// owned by two members of a group at once, that committed offsets never
// go backwards, that nothing acknowledged is lost and that every record
// is consumed. Run with the e2e tests' short fleet timers (3s session,
// 300ms heartbeats) and with the defaults (10s, 1s).
func TestFleetFailoverWithinDetection(t *testing.T) {
	t.Run("session_3s", func(t *testing.T) { failoverWithinDetection(t, 3*time.Second, 300*time.Millisecond) })
	t.Run("defaults", func(t *testing.T) {
		failoverWithinDetection(t, fleet.DefaultSessionTimeout, fleet.DefaultHeartbeatInterval)
	})
}

func failoverWithinDetection(t *testing.T, session, heartbeat time.Duration) {
	detection := session + heartbeat
	fc := kproxy.FleetConfig{SessionTimeout: session, HeartbeatInterval: heartbeat}
	// The members' sessions (classic and KIP-848) outlast the failover
	// (as Kafka's default 45s outlasts the default fleet session), so
	// that B's router does not tell them to give up (relay_members.go)
	// before their group's new owner serves them.
	memberSession := max(cutSession, 2*detection)
	configs := map[string]string{
		"group.consumer.session.timeout.ms":    fmt.Sprint(memberSession.Milliseconds()),
		"group.consumer.heartbeat.interval.ms": "300",
	}
	const topic, partitions = "failover", 6
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.GroupMinSessionTimeout(time.Second),
		kfake.SeedTopics(partitions, topic), kfake.BrokerConfigs(configs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	pathA := newFaultPath(t)
	a := startFailoverKproxy(t, brokers, fc, memberSession, pathA)
	waitUntil(t, 60*time.Second, "A to serve every partition", func() bool {
		s, ok := fleetServing(a)
		return ok && len(s) == fleetPartitions
	})
	b := startFailoverKproxy(t, brokers, fc, memberSession, nil)
	var servedByA []int32
	waitUntil(t, 60*time.Second, "A and B to share the partitions", func() bool {
		sa, okA := fleetServing(a)
		sb, okB := fleetServing(b)
		servedByA = sa
		return okA && okB && len(sa) > 0 && len(sb) > 0 && len(sa)+len(sb) == fleetPartitions
	})
	classicGroup, kipGroup := groupOn("failover-classic", servedByA), groupOn("failover-848", servedByA)
	const directGroup = "failover-direct"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prod, _, stopProducing := startSteadyProducer(ctx, t, brokers, topic)
	groups := []string{classicGroup, kipGroup, directGroup}
	seen := map[string]map[int32]map[int64]bool{}
	for _, g := range groups {
		seen[g] = map[int32]map[int64]bool{}
	}
	var seenMu sync.Mutex
	watch := watchOffsets(ctx, t, brokers, topic, groups...)
	// Every member retries a commit for 30s (franz-go's default retry
	// timeout), so that a retry's backoff is the client's own, as in an
	// application, not cut short by a failed commit call.
	retry := kgo.RetryTimeout(30 * time.Second)
	classic := []kgo.Opt{kgo.SessionTimeout(memberSession), retry}
	kip := append(slices.Clone(kip848Member), retry)
	member := func(name, group string, seeds []string, opts []kgo.Opt) *faultMember {
		return startFaultMember(t, ctx, name, group, topic, seeds, nil, seen[group], &seenMu, opts...)
	}
	c1 := member("c1-on-b", classicGroup, []string{b.Addr()}, classic)
	c2 := member("c2-on-b", classicGroup, []string{b.Addr()}, classic)
	k1 := member("k1-on-b", kipGroup, []string{b.Addr()}, kip)
	k2 := member("k2-on-b", kipGroup, []string{b.Addr()}, kip)
	d1 := member("d1-direct", directGroup, brokers, classic)
	d2 := member("d2-direct", directGroup, brokers, classic)
	viaB := []*faultMember{c1, c2, k1, k2}
	all := append(slices.Clone(viaB), d1, d2)
	waitUntil(t, 90*time.Second, "every member to own a partition and commit", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(time.Time{}); !ok || m.assigned.Load() == 0 {
				return false
			}
		}
		return true
	})
	checkSpeaksKIP848(t, k1, k2)
	pc, pk := kafkastore.GroupPartition(classicGroup, fleetPartitions), kafkastore.GroupPartition(kipGroup, fleetPartitions)
	if s, ok := fleetServing(a); !ok || !slices.Contains(s, pc) || !slices.Contains(s, pk) {
		t.Fatalf("A no longer serves the groups' partitions (serves %v)", s)
	}
	// Steady state; the fleet's heartbeats over it are counted at the
	// brokers (the cost of the fleet session chosen, docs/fleet.md).
	var fleetBeats atomic.Int64
	cluster.ControlKey(int16(kmsg.Heartbeat), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if strings.HasPrefix(r.(*kmsg.HeartbeatRequest).Group, fleet.DefaultGroup) {
			fleetBeats.Add(1)
		}
		return nil, nil, false
	})
	const steady = 3 * time.Second
	time.Sleep(steady)
	beats := fleetBeats.Load()
	perKproxy := float64(beats) / steady.Seconds() / 2
	t.Logf("fleet heartbeats at the brokers: %.2f/s per kproxy (1/interval = %.2f/s)", perKproxy, 1/heartbeat.Seconds())
	if want := 1 / heartbeat.Seconds(); perKproxy < want/2 || perKproxy > want*2 {
		t.Errorf("%.2f fleet heartbeats/s per kproxy, want about %.2f", perKproxy, want)
	}

	// When B starts serving the groups' partitions: the end of the
	// fleet's part of the wait.
	var servedAt time.Time
	servedCh := make(chan struct{})
	faultAt := time.Now()
	go func() {
		defer close(servedCh)
		for ctx.Err() == nil {
			if s, ok := fleetServing(b); ok && slices.Contains(s, pc) && slices.Contains(s, pk) {
				servedAt = time.Now()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	faultFor := detection + 6*time.Second
	pathA.apply(func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) })
	time.Sleep(faultFor)
	healAt := time.Now()
	pathA.apply(nil)
	<-servedCh

	waitUntil(t, 60*time.Second, "every member to commit after heal", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(healAt); !ok {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second)
	stopProducing()
	checkConsumedAndKept(t, ctx, prod, topic, map[string][]*faultMember{
		classicGroup: {c1, c2}, kipGroup: {k1, k2}, directGroup: {d1, d2},
	}, seen, &seenMu)
	watch.check(t)
	checkRetriableOnly(t, all)
	for _, g := range [][]*faultMember{{c1, c2}, {k1, k2}, {d1, d2}} {
		checkOwnedOnce(t, g...)
	}

	if servedAt.IsZero() {
		t.Fatal("B never served the groups' partitions")
	}
	t.Logf("fleet session %v, heartbeat %v: detection %v; B served the groups %.2fs into the fault", session, heartbeat,
		detection, servedAt.Sub(faultAt).Seconds())
	bound := detection + time.Second
	for _, m := range all {
		w, last, next := m.stallAcross(faultAt, healAt)
		t.Logf("%-10s no commit for %5.2fs (last %+5.2fs, next %+5.2fs into the fault)", m.name, w.Seconds(),
			last.Sub(faultAt).Seconds(), next.Sub(faultAt).Seconds())
		if w > bound && slices.Contains(viaB, m) {
			t.Errorf("%s went %v without a commit; want at most the fleet's detection time %v plus 1s", m.name,
				w.Round(time.Millisecond), detection)
			l := m.log.String()
			t.Logf("%s log tail:\n%s", m.name, l[max(0, len(l)-4000):])
		}
	}
	cancel()
}

// startFailoverKproxy starts an in-process fleet kproxy (fleet timers of
// fc, KIP-848 sessions of memberSession) whose every connection to the
// cluster (its own clients' and its clients' forwarded traffic) goes
// through path when path is not nil.
func startFailoverKproxy(t testing.TB, brokers []string, fc kproxy.FleetConfig, memberSession time.Duration, path *faultPath) *kproxy.Server {
	t.Helper()
	cfg := inProcessConfig(brokers, kproxy.GroupsDistributed, fc)
	e := &cfg.Groups.Engine
	e.ConsumerSessionTimeout, e.ConsumerMinSessionTimeout = memberSession, time.Second
	e.ConsumerHeartbeatInterval, e.TopicRefreshInterval = 300*time.Millisecond, time.Second
	if path != nil {
		cfg.UpstreamOpts = []kgo.Opt{kgo.Dialer(path.dial)}
		cfg.Proxy.Dial = path.dial
	}
	return startKproxyConfig(t, cfg)
}

// stallAcross is the longest time between successful commits of m from
// its last commit before from to its first at or after to (to itself
// when there is none), and the commits that bound it.
func (m *faultMember) stallAcross(from, to time.Time) (worst time.Duration, last, next time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := from
	for _, c := range m.commits {
		if c.Before(from) {
			prev = c
			continue
		}
		if c.Sub(prev) > worst {
			worst, last, next = c.Sub(prev), prev, c
		}
		prev = c
		if !c.Before(to) {
			break
		}
	}
	if to.Sub(prev) > worst && prev.Before(to) {
		worst, last, next = to.Sub(prev), prev, to
	}
	return worst, last, next
}

// checkOwnedOnce fails the test when two members of one group owned a
// partition at the same time, from their partition callbacks: a member
// is given a partition (OnPartitionsAssigned) only after the member that
// held it gave it up (OnPartitionsRevoked or OnPartitionsLost).
func checkOwnedOnce(t testing.TB, members ...*faultMember) {
	t.Helper()
	type ev struct {
		partEvent
		who string
	}
	var evs []ev
	for _, m := range members {
		m.mu.Lock()
		for _, e := range m.events {
			evs = append(evs, ev{e, m.name})
		}
		m.mu.Unlock()
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	holder := map[int32]string{}
	for _, e := range evs {
		for _, p := range e.parts {
			switch {
			case e.kind != "assigned":
				if holder[p] == e.who {
					delete(holder, p)
				}
			case holder[p] != "" && holder[p] != e.who:
				t.Errorf("partition %d given to %s at %s while %s still owned it", p, e.who, e.at.Format("15:04:05.000"), holder[p])
				holder[p] = e.who
			default:
				holder[p] = e.who
			}
		}
	}
}
