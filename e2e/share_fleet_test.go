package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/faultnet"
)

// TestShareGroupsServedFleet: a fleet of three kproxy processes serves a
// share group in front of a cluster without share groups. Its two
// members connect to the two kproxies that do not own the group, so
// every step that reads or changes the group's state crosses the peer
// wire, while each member's records come from the brokers through its
// own kproxy. A third of the way through, the owner is SIGKILLed (or
// paused, and resumed after the fleet moved the group); a survivor
// takes the group over from its stored state. From the
// members' ledger: every record ends accepted or rejected, none is
// delivered again after its accept or reject was answered OK, delivery
// counts only rise and stay within the limit, both members got records;
// through a survivor, every share-partition then starts at its log's end.
func TestShareGroupsServedFleet(t *testing.T) {
	t.Parallel()
	t.Run("owner SIGKILLed", func(t *testing.T) { runShareFleet(t, ownerKilled) })
	// A paused owner comes back after the fleet gave its groups to
	// another: it must write nothing (the fleet's fencing) and the
	// ledger must not tell.
	t.Run("owner SIGSTOPped", func(t *testing.T) { runShareFleet(t, ownerPaused) })
	// An owner cut off from the brokers (both directions blackholed)
	// stays reachable by its peers: its writes hang, its fleet lease
	// runs out, a survivor takes the group over; healed later, it must
	// write nothing and answer nothing it did not store.
	t.Run("owner cut off from the brokers", func(t *testing.T) { runShareFleet(t, ownerCutOff) })
}

// shareFleetFault is what befalls the share group's owner.
type shareFleetFault int

const (
	ownerKilled shareFleetFault = iota
	ownerPaused
	ownerCutOff
)

func runShareFleet(t *testing.T, fault shareFleetFault) {
	const (
		topic, group = "fleet-share", "fleet-share-g"
		partitions   = int32(3)
		n            = 900
	)
	cluster, err := kfake.NewCluster(append(noShareCluster(), kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()

	direct, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	setShareReset(ctx, t, direct, group)

	args := append(append([]string{}, fleetArgs...), "--share-groups", "serve")
	// Each kproxy reaches the broker through a fault relay of its own
	// (--upstream-dial-via: the broker advertises its own address).
	relays := map[string]*faultnet.Relay{}
	start := func(name string) *kproxyProc {
		r, err := faultnet.Listen(brokers[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		relays[name] = r
		return startKproxy(t, name, brokers, append(args, "--upstream-dial-via", brokers[0]+"="+r.Addr())...)
	}
	a, b, c := start("A"), start("B"), start("C")
	procs := []*kproxyProc{a, b, c}
	owners := waitFleetSettled(t, procs, 30*time.Second)
	byName := map[string]*kproxyProc{"A": a, "B": b, "C": c}
	owner := byName[owners[kafkastore.GroupPartition(group, fleetPartitions)]]
	var others []string
	for _, k := range procs {
		if k != owner {
			others = append(others, k.addr)
		}
	}
	t.Logf("%s is owned by %s; its members use the other two", group, owner.name)

	act := func(v string, delivery int32) kgo.AckStatus {
		switch {
		case strings.HasSuffix(v, "3") && delivery == 1:
			return kgo.AckRelease
		case strings.HasSuffix(v, "7"):
			return kgo.AckReject
		}
		return kgo.AckAccept
	}
	l := newShareLedger()
	l.slack = 1 // one failover
	var ends kadm.ListedOffsets
	var lastCheck time.Time
	l.settled = func() bool { // under l.mu, from the consumers' loops
		if time.Since(lastCheck) < 200*time.Millisecond {
			return false
		}
		lastCheck = time.Now()
		return atLogEnds(ctx, others[0], group, topic, partitions, ends) == nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		consumeShareLedgerOn(t, l, others, group, topic, 2, n, 120*time.Second, act)
	}()
	// Both members in the group before the records come, so both get
	// some (the first member would otherwise take them all).
	cl, err := kgo.NewClient(kgo.SeedBrokers(others[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		d, err := adm.DescribeShareGroups(ctx, group)
		if err == nil && len(d[group].Members) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two members did not join %s: %+v %v", group, d[group], err)
		}
	}
	for i := range n {
		direct.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
	}
	if err := direct.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ends, err = kadm.NewClient(direct).ListEndOffsets(ctx, topic); err != nil {
		t.Fatal(err)
	}
	for l.final() < n/3 {
		select {
		case <-done:
			t.Fatalf("the members stopped after %d of %d records", l.final(), n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	killed := time.Now()
	switch fault {
	case ownerKilled:
		owner.signal(t, syscall.SIGKILL)
	case ownerPaused:
		owner.signal(t, syscall.SIGSTOP)
	case ownerCutOff:
		relays[owner.name].Blackhole(faultnet.Both)
	}
	t.Logf("fault %d to the owner %s after %d final records", fault, owner.name, l.final())
	switch fault {
	case ownerPaused:
		// Back once the fleet moved the group (its session is 3 s).
		time.Sleep(5 * time.Second)
		owner.signal(t, syscall.SIGCONT)
	}
	healed := make(chan struct{})
	if fault == ownerCutOff {
		// Healed once the fleet moved the group: the old owner's held
		// writes then reach the broker, where the fencing refuses them.
		go func() {
			defer close(healed)
			time.Sleep(8 * time.Second)
			relays[owner.name].Heal()
			time.Sleep(time.Second) // for its held writes to land, or not
		}()
	} else {
		close(healed)
	}
	<-done
	t.Logf("%d records final %v after the fault", l.final(), time.Since(killed).Round(time.Millisecond))
	<-healed

	l.mu.Lock()
	for _, v := range l.violations {
		t.Error(v)
	}
	// An acknowledgement in flight when the owner died is answered
	// with an error although the owner may have stored it: such a
	// record is final only if the share-partitions' starts reach the
	// logs' ends (checked below).
	unsettled := l.unsettledLocked()
	if got := len(l.accepted) + len(l.rejected); got+unsettled != n {
		t.Errorf("%d of %d records reached a final state, %d more were acknowledged without an answer (%d delivered; consumer errors %v)", got, n, unsettled, len(l.deliveries), l.errs)
	}
	// The owner's death fails the acknowledgements it could not take
	// (NOT_LEADER_OR_FOLLOWER, as when a share-partition's leader
	// changes), and the next owner starts with the records the dead one
	// had handed out available again, so their later acknowledgements
	// are refused (INVALID_RECORD_STATE).
	for _, err := range l.errs {
		if !errors.Is(err, kerr.NotLeaderForPartition) && !errors.Is(err, kerr.InvalidRecordState) {
			t.Errorf("consumer error %v, want none but NOT_LEADER_OR_FOLLOWER and INVALID_RECORD_STATE during the failover", err)
		}
	}
	for v, ds := range l.deliveries {
		// Each delivery the coordinator hands out has its own number;
		// members poll them in their own order, and one the owner
		// counted may not reach a member when the owner dies.
		seen := map[int32]bool{}
		for _, d := range ds {
			if d < 1 || d > 5 || seen[d] {
				t.Errorf("record %s: delivery counts %v, want distinct counts within the limit 5", v, ds)
				break
			}
			seen[d] = true
		}
	}
	// Every delivery came through a kproxy that does not own the group:
	// record bytes do not pass through the owner.
	if total := l.byMember["ledger-0"] + l.byMember["ledger-1"]; total < n {
		t.Errorf("%d deliveries through the non-owners, want at least %d", total, n)
	}
	t.Logf("deliveries per member %v; consumer errors during the failover: %d; acknowledged without an answer: %d", l.byMember, len(l.errs), unsettled)
	l.mu.Unlock()

	// Every share-partition starts at its log's end, as a survivor
	// answers kafka-share-groups --describe --offsets.
	if err := atLogEnds(ctx, others[0], group, topic, partitions, ends); err != nil {
		t.Error(err)
	}
}

// atLogEnds checks, through addr, that every share-partition of group
// starts at the end of its log (ends): every record reached a final
// state.
func atLogEnds(ctx context.Context, addr, group, topic string, partitions int32, ends kadm.ListedOffsets) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return fmt.Errorf("describing the share offsets of %s: %w", group, err)
	}
	if err := offs[group].Err; err != nil {
		return fmt.Errorf("describing the share offsets of %s: %w", group, err)
	}
	for p := range partitions {
		o, ok := offs[group].Offsets.Lookup(topic, p)
		end, _ := ends.Lookup(topic, p)
		if !ok || o.Err != nil || o.StartOffset != end.Offset {
			return fmt.Errorf("share-partition %s/%d starts at %d (%v, found %v), its log ends at %d", topic, p, o.StartOffset, o.Err, ok, end.Offset)
		}
	}
	return nil
}
