package e2e

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// describeMixed answers ConsumerGroupDescribe for group through addr:
// the group epoch, member id → member epoch, and how many members speak
// each protocol (MemberType 0 classic, 1 consumer).
func describeMixed(ctx context.Context, t testing.TB, addr, group string) (epoch int32, epochs map[string]int32, classic, consumer int, state string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Version = 1
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("ConsumerGroupDescribe via %s: %v", addr, err)
	}
	g := resp.Groups[0]
	epochs = map[string]int32{}
	for _, m := range g.Members {
		epochs[m.MemberID] = m.MemberEpoch
		if m.MemberType == 1 {
			consumer++
		} else {
			classic++
		}
	}
	return g.Epoch, epochs, classic, consumer, g.State
}

// TestFleetMixedGroupSurvivesOwnerKill runs a mixed group (two franz-go
// classic cooperative-sticky members inside a consumer group with one
// KIP-848 member, issue 11) on a fleet of two `kproxy serve` processes,
// its members behind the kproxy that does not own it, and SIGKILLs the
// owner. The survivor loads the group from its record as a coordinator
// failover in Kafka does: the same members at the same epochs and
// generations, no rebalance, records keep being consumed with no
// partition owned twice. The KIP-848 member then leaves and the loaded
// group converts back to a classic group; every record is consumed and
// committed.
func TestFleetMixedGroupSurvivesOwnerKill(t *testing.T) {
	const topic, parts, group = "fleet-mig", 6, "fleet-mixed-group"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	a := startKproxy(t, "A", brokers, fleetArgs...)
	b := startKproxy(t, "B", brokers, fleetArgs...)
	owners := waitFleetSettled(t, []*kproxyProc{a, b}, 30*time.Second)
	owner, other := a, b
	if owners[kafkastore.GroupPartition(group, fleetPartitions)] == "B" {
		owner, other = b, a
	}
	t.Logf("%s is owned by %s; its members use %s", group, owner.name, other.name)

	own, recs := newOwnership(t), newRecords()
	// Sessions outlast the failover (fleet session 3 s plus a claim).
	classic := memberCfg{group: group, topic: topic, own: own, recs: recs,
		opts: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(10 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)}}
	consumer := memberCfg{group: group, topic: topic, own: own, recs: recs, opts: k848Opts}
	c1 := startMemberAt(t, other.addr, "c1", classic)
	c2 := startMemberAt(t, other.addr, "c2", classic)
	defer c1.leave()
	defer c2.leave()
	waitOwners(t, own, parts, "c1", "c2")
	k1 := startMemberAt(t, other.addr, "k1", consumer) // converts the group
	waitOwners(t, own, parts, "c1", "c2", "k1")

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produced := 0
	produce := func(n int) {
		for range n {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(itoa(produced))}).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
			produced++
		}
	}
	produce(200)
	waitConsumed(t, recs, produced)

	// Stable and mixed before the kill.
	var epoch int32
	var epochs map[string]int32
	deadline := time.Now().Add(20 * time.Second)
	for {
		var cl, co int
		var state string
		epoch, epochs, cl, co, state = describeMixed(ctx, t, other.addr, group)
		if state == "Stable" && cl == 2 && co == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group never became a Stable mixed group: state %s, %d classic, %d consumer", state, cl, co)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gens := generations([]*member{c1, c2, k1})
	ownersBefore := own.owners()

	killed := time.Now()
	owner.signal(t, syscall.SIGKILL)
	<-owner.exited
	waitFleetSettled(t, []*kproxyProc{other}, 30*time.Second)
	t.Logf("failover after SIGKILL: %v", time.Since(killed).Round(time.Millisecond))
	produce(200)
	waitConsumed(t, recs, produced)

	epochAfter, epochsAfter, cl, co, _ := describeMixed(ctx, t, other.addr, group)
	if epochAfter != epoch || cl != 2 || co != 1 || len(epochsAfter) != 3 {
		t.Fatalf("after the owner's death the group is at epoch %d with %d classic and %d consumer members, want epoch %d, 2 and 1", epochAfter, cl, co, epoch)
	}
	for id, e := range epochs {
		if epochsAfter[id] != e {
			t.Fatalf("member %s went from epoch %d to %d (before %v, after %v)", id, e, epochsAfter[id], epochs, epochsAfter)
		}
	}
	if now := generations([]*member{c1, c2, k1}); !slices.Equal(now, gens) {
		t.Fatalf("the members' generations went from %v to %v across the ownership move", gens, now)
	}
	if now := own.owners(); !equalOwners(now, ownersBefore) {
		t.Fatalf("partition owners changed across the ownership move: %v → %v", ownersBefore, now)
	}
	own.check()

	// The loaded group downgrades when its KIP-848 member leaves.
	k1.leave()
	waitOwners(t, own, parts, "c1", "c2")
	produce(100)
	waitConsumed(t, recs, produced)
	cl2, err := kgo.NewClient(kgo.SeedBrokers(other.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	deadline = time.Now().Add(20 * time.Second)
	for m := groupTypeMismatch(ctx, cl2, group, "classic", 2); m != ""; m = groupTypeMismatch(ctx, cl2, group, "classic", 2) {
		if time.Now().After(deadline) {
			t.Fatalf("the loaded group did not convert back to classic: %s", m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	assertCommittedAtEnd(ctx, t, brokers, group, topic)
	own.check()
}
