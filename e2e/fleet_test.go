package e2e

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// fleetArgs run a kproxy of a test fleet: short fleet and member
// timeouts so that a failover fits in a test.
var fleetArgs = []string{
	"--groups", "distributed",
	"--fleet-session-timeout", "3s", "--fleet-heartbeat-interval", "300ms",
	"--group-initial-rebalance-delay", "0s", "--group-min-session-timeout", "1s",
}

// fleetPartitions is the partition count of the groups topic kproxy
// creates.
const fleetPartitions = 16

// servingMap asks every live kproxy what it serves: partition → names.
func servingMap(procs []*kproxyProc) map[int32][]string {
	out := map[int32][]string{}
	for _, k := range procs {
		v, ok := k.fleet()
		if !ok {
			continue
		}
		for _, p := range v.Serving {
			out[p] = append(out[p], k.name)
		}
	}
	return out
}

// waitFleetSettled waits until every partition is served by exactly one
// of procs and each of procs serves some, and returns who serves what.
func waitFleetSettled(t testing.TB, procs []*kproxyProc, within time.Duration) map[int32]string {
	t.Helper()
	deadline := time.Now().Add(within)
	var last map[int32][]string
	for time.Now().Before(deadline) {
		last = servingMap(procs)
		ok := len(last) == fleetPartitions
		serves := map[string]bool{}
		for _, names := range last {
			ok = ok && len(names) == 1
			serves[names[0]] = true
		}
		ok = ok && len(serves) == len(procs)
		if ok {
			owners := map[int32]string{}
			for p, names := range last {
				owners[p] = names[0]
			}
			return owners
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the fleet never settled on one owner per partition: %v", last)
	return nil
}

// offsetWatch polls committed offsets directly from the cluster and
// records every time one goes backwards.
type offsetWatch struct {
	mu        sync.Mutex
	last      map[string]int64 // group/partition → highest seen, guarded by mu
	backwards []string         // guarded by mu
}

func watchOffsets(ctx context.Context, t testing.TB, brokers []string, topic string, groups ...string) *offsetWatch {
	w := &offsetWatch{last: map[string]int64{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	go func() {
		defer cl.Close()
		for ctx.Err() == nil {
			for _, g := range groups {
				offs, err := adm.FetchOffsets(ctx, g)
				if err != nil {
					continue
				}
				offs.Each(func(o kadm.OffsetResponse) {
					if o.Topic != topic || o.Err != nil {
						return
					}
					key := g + "/" + itoa(int(o.Partition))
					w.mu.Lock()
					if prev, ok := w.last[key]; ok && o.At < prev {
						w.backwards = append(w.backwards, key+": "+itoa(int(prev))+" → "+itoa(int(o.At)))
					}
					w.last[key] = max(w.last[key], o.At)
					w.mu.Unlock()
				})
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return w
}

func (w *offsetWatch) check(t testing.TB) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.backwards) > 0 {
		t.Errorf("committed offsets went backwards: %v", w.backwards)
	}
}

// generations returns each member's view of its group's generation.
func generations(mems []*member) []int32 {
	var out []int32
	for _, m := range mems {
		_, gen := m.cl.GroupMetadata()
		out = append(out, gen)
	}
	return out
}

// TestFleetOneOwnerPerGroup runs three `kproxy serve` processes in front
// of one in-memory cluster with the members of three groups (franz-go
// cooperative, eager and KIP-848; sarama range) spread over them, and then: SIGKILLs
// the owner of the cooperative group, SIGSTOPs the next owner past its
// lease and resumes it, adds a fourth kproxy and SIGTERMs it. Throughout:
// no partition of the data topic is owned by two members of a group at
// once, every partition of the groups topic is served by at most one
// kproxy, committed offsets never go backwards, every record is consumed
// by every group and the committed offsets end at the end offsets; the
// cooperative group does not rebalance when the owner it did not talk to
// directly dies.
func TestFleetOneOwnerPerGroup(t *testing.T) {
	const topic, partitions, total = "fleet-t", 6, 3000
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()

	a := startKproxy(t, "A", brokers, fleetArgs...)
	b := startKproxy(t, "B", brokers, fleetArgs...)
	c := startKproxy(t, "C", brokers, fleetArgs...)
	procs := []*kproxyProc{a, b, c}
	owners := waitFleetSettled(t, procs, 30*time.Second)
	t.Logf("fleet settled: %v", owners)

	// A sampler of the fleet: at no sampled instant two kproxies serve
	// one partition.
	var doubleMu sync.Mutex
	var doubles []string
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var live sync.Map // name → *kproxyProc still sampled
	for _, k := range procs {
		live.Store(k.name, k)
	}
	go func() {
		for sampleCtx.Err() == nil {
			var ks []*kproxyProc
			live.Range(func(_, v any) bool { ks = append(ks, v.(*kproxyProc)); return true })
			for p, names := range servingMap(ks) {
				if len(names) > 1 {
					doubleMu.Lock()
					doubles = append(doubles, "partition "+itoa(int(p))+" served by "+strings.Join(names, ","))
					doubleMu.Unlock()
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	coop, eager, k848, saramaGroup := "fleet-coop", "fleet-eager", "fleet-848", "fleet-sarama"
	pCoop := kafkastore.GroupPartition(coop, fleetPartitions)
	byName := map[string]*kproxyProc{"A": a, "B": b, "C": c}
	first := byName[owners[pCoop]]
	var others []*kproxyProc
	for _, k := range procs {
		if k != first {
			others = append(others, k)
		}
	}
	t.Logf("%s (groups partition %d) is owned by %s; its members use %s and %s", coop, pCoop, first.name, others[0].name, others[1].name)

	type groupRun struct {
		name   string
		own    *ownership
		recs   *records
		opts   []kgo.Opt
		mems   []*member
		sarama []*saramaMember
	}
	// The members' session outlasts a failover (the fleet session, 3s,
	// plus a claim): franz-go retries a heartbeat for the session timeout
	// before it rejoins.
	memberOpts := []kgo.Opt{kgo.SessionTimeout(10 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)}
	groups := []*groupRun{
		{name: coop, opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}},
		{name: eager, opts: []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())}},
		{name: k848, opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}},
		{name: saramaGroup},
	}
	for _, g := range groups {
		g.own, g.recs = newOwnership(t), newRecords()
		for i, k := range others {
			name := g.name + "-" + itoa(i) + "@" + k.name
			mc := memberCfg{group: g.name, topic: topic, own: g.own, recs: g.recs, opts: append(slices.Clone(memberOpts), g.opts...), session: 10 * time.Second}
			if g.name == saramaGroup {
				g.sarama = append(g.sarama, startSaramaAt(t, k.addr, name, sarama.NewBalanceStrategyRange(), mc))
				continue
			}
			g.mems = append(g.mems, startMemberAt(t, k.addr, name, mc))
		}
	}
	defer func() {
		for _, g := range groups {
			for _, m := range g.mems {
				m.leave()
			}
			for _, m := range g.sarama {
				m.leave()
			}
		}
	}()
	watch := watchOffsets(ctx, t, brokers, topic, coop, eager, k848, saramaGroup)

	// Records flow for the whole test, directly to the cluster.
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; i < total; i++ {
			prod.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
				}
			})
			if i%25 == 24 {
				time.Sleep(200 * time.Millisecond)
			}
		}
		prod.Flush(ctx)
	}()
	for _, g := range groups {
		waitOwners(t, g.own, partitions, memberNames(g.mems, g.sarama)...)
	}
	genBefore := generations(groups[0].mems)

	// 1. SIGKILL the owner of the cooperative group.
	killed := time.Now()
	first.signal(t, syscall.SIGKILL)
	<-first.exited
	live.Delete(first.name)
	survivors := others
	owners = waitFleetSettled(t, survivors, 30*time.Second)
	t.Logf("failover after SIGKILL: %v until the survivors serve every partition", time.Since(killed).Round(time.Millisecond))
	for _, g := range groups {
		waitConsumedMore(t, g.recs, 30*time.Second)
	}
	if gen := generations(groups[0].mems); !slices.Equal(gen, genBefore) {
		t.Errorf("%s went from generations %v to %v when the kproxy owning it died: its members should not rebalance", coop, genBefore, gen)
	}

	// 2. SIGSTOP the new owner past its lease, then SIGCONT: the others
	// take its partitions over; once resumed it serves none of them.
	second := byName[owners[pCoop]]
	var third *kproxyProc
	for _, k := range survivors {
		if k != second {
			third = k
		}
	}
	servedBefore, _ := second.fleet()
	second.signal(t, syscall.SIGSTOP)
	// The members behind the paused kproxy are cut off as by a network
	// partition: what they think they own is no longer theirs once their
	// group expires them, exactly as with a partitioned client of a
	// broker. They own again only what a later assignment gives them.
	for _, g := range groups {
		for _, name := range memberNames(g.mems, g.sarama) {
			if strings.HasSuffix(name, "@"+second.name) {
				g.own.releaseAll(name)
			}
		}
	}
	live.Delete(second.name)
	stopped := time.Now()
	waitFleetSettled(t, []*kproxyProc{third}, 30*time.Second)
	t.Logf("failover after SIGSTOP: %v", time.Since(stopped).Round(time.Millisecond))
	time.Sleep(time.Until(stopped.Add(6 * time.Second)))
	second.signal(t, syscall.SIGCONT)
	live.Store(second.name, second)
	// Resumed, the zombie must not serve what it lost; it may rejoin and
	// be given partitions again only through the fleet.
	if v, ok := second.fleet(); ok && v.Member.Generation == servedBefore.Member.Generation && len(v.Serving) > 0 {
		t.Errorf("%s resumed after its lease still serving %v in fleet generation %d", second.name, v.Serving, v.Member.Generation)
	}
	waitFleetSettled(t, survivors, 30*time.Second)

	// 3. A kproxy added moves only some partitions.
	before := waitFleetSettled(t, survivors, 30*time.Second)
	d := startKproxy(t, "D", brokers, fleetArgs...)
	live.Store(d.name, d)
	all := append(slices.Clone(survivors), d)
	after := waitFleetSettled(t, all, 30*time.Second)
	moved := 0
	for p, o := range after {
		if before[p] != o {
			moved++
		}
	}
	if moved == 0 || moved == fleetPartitions {
		t.Errorf("adding a kproxy moved %d of %d partitions (before %v, after %v)", moved, fleetPartitions, before, after)
	}

	// 4. SIGTERM hands D's partitions back cleanly.
	termed := time.Now()
	d.signal(t, syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.err != nil {
			t.Errorf("D exited with %v after SIGTERM", d.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("D did not exit within 20s of SIGTERM")
	}
	live.Delete(d.name)
	waitFleetSettled(t, survivors, 30*time.Second)
	t.Logf("handover after SIGTERM: %v", time.Since(termed).Round(time.Millisecond))

	// Every record consumed by every group, offsets at the end.
	<-produced
	for _, g := range groups {
		waitConsumed(t, g.recs, total)
	}
	for _, g := range groups {
		assertCommittedAtEnd(ctx, t, brokers, g.name, topic)
	}
	stopSampling()
	watch.check(t)
	doubleMu.Lock()
	if len(doubles) > 0 {
		t.Errorf("a groups partition was served by two kproxies at once: %v", head(doubles, 5))
	}
	doubleMu.Unlock()
	for _, g := range groups {
		g.own.check()
	}
}

// memberNames lists the names of franz-go and sarama members.
func memberNames(mems []*member, sm []*saramaMember) []string {
	var out []string
	for _, m := range mems {
		out = append(out, m.name)
	}
	for _, m := range sm {
		out = append(out, m.name)
	}
	return out
}

// waitConsumedMore waits until recs has grown.
func waitConsumedMore(t testing.TB, recs *records, within time.Duration) {
	t.Helper()
	from := recs.distinct()
	deadline := time.Now().Add(within)
	for recs.distinct() <= from {
		if time.Now().After(deadline) {
			t.Fatalf("consumption stalled at %d records", from)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFleetRelayOnly runs a kproxy that owns nothing (--fleet-role relay)
// beside one owner: the members behind the relay form their group at the
// owner, consume every record and commit to the end, and the relay never
// serves a partition.
func TestFleetRelayOnly(t *testing.T) {
	const topic, partitions, total = "relay-t", 4, 400
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	owner := startKproxy(t, "owner", brokers, fleetArgs...)
	relay := startKproxy(t, "relay", brokers, append(slices.Clone(fleetArgs), "--fleet-role", "relay")...)
	waitFleetSettled(t, []*kproxyProc{owner}, 30*time.Second)
	own, recs := newOwnership(t), newRecords()
	var mems []*member
	for i := range 2 {
		mems = append(mems, startMemberAt(t, relay.addr, "relayed-"+itoa(i), memberCfg{group: "relayed", topic: topic, own: own, recs: recs}))
	}
	defer func() {
		for _, m := range mems {
			m.leave()
		}
	}()
	prod, err := kgo.NewClient(kgo.SeedBrokers(relay.addr), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range total {
		prod.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitOwners(t, own, partitions, mems[0].name, mems[1].name)
	waitConsumed(t, recs, total)
	assertCommittedAtEnd(ctx, t, brokers, "relayed", topic)
	own.check()
	if v, ok := relay.fleet(); !ok || len(v.Serving) != 0 {
		t.Errorf("the relay serves %v (answered %v), want nothing", v.Serving, ok)
	}
	if !strings.Contains(relay.log(), "role=relay") {
		t.Errorf("the relay did not log its role")
	}
}
