package e2e

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// Anchored groups (docs/anchors.md) against kfake, which implements
// static membership, the classic coordinator's member checks on
// OffsetCommit, NON_EMPTY_GROUP and GROUP_SUBSCRIBED_TO_TOPIC. Where it
// differs from Kafka (a static member rejoining a Stable group with other
// metadata rebalances in kfake, Kafka keeps the generation) the anchor
// only sees one more generation; the interop tier covers the real broker.

// directAdmin is an admin client straight to the cluster, as an operator
// running kafka-consumer-groups against the brokers.
func directAdmin(t testing.TB, s *stack) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// describeDirect describes group directly against the cluster.
func describeDirect(ctx context.Context, t testing.TB, adm *kadm.Client, group string) kadm.DescribedGroup {
	t.Helper()
	d, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	return d[group]
}

// isAnchorMember reports whether m, a member of a group on the cluster,
// is an anchor of kproxy's.
func isAnchorMember(m kadm.DescribedGroupMember) bool {
	return m.InstanceID != nil && strings.HasPrefix(*m.InstanceID, coexist.DefaultAnchorInstanceID)
}

// waitDirect waits until the cluster's view of group satisfies ok.
func waitDirect(ctx context.Context, t testing.TB, adm *kadm.Client, group, what string, ok func(kadm.DescribedGroup) bool) kadm.DescribedGroup {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := describeDirect(ctx, t, adm, group)
		if ok(d) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s never became %s on the cluster: state %s, %d members", group, what, d.State, len(d.Members))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnchorClusterKnows: while kproxy serves a group, the cluster shows
// it live with kproxy's anchor, refuses a direct delete of it and of the
// offsets of its subscribed topic, and lag tools read its offsets; once
// its members left, the anchor leaves and a direct delete succeeds.
func TestAnchorClusterKnows(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const group, topic, n = "anchored", "anchored-t", 300
	s.produce(ctx, topic, 3, n)
	own, recs := newOwnership(t), newRecords()
	m := s.startMember("m1", memberCfg{group: group, topic: topic, own: own, recs: recs})
	waitOwners(t, own, 3, "m1")
	adm := directAdmin(t, s)

	// The anchor holds, on the cluster, the partitions kproxy's member
	// owns: direct tools show them assigned.
	d := waitDirect(ctx, t, adm, group, "anchored with the member's partitions", func(d kadm.DescribedGroup) bool {
		if d.State != "Stable" || len(d.Members) != 1 || d.Members[0].InstanceID == nil ||
			*d.Members[0].InstanceID != coexist.DefaultAnchorInstanceID {
			return false
		}
		a, ok := d.Members[0].Assigned.AsConsumer()
		return ok && len(a.Topics) == 1 && a.Topics[0].Topic == topic && len(a.Topics[0].Partitions) == 3
	})
	if d.ProtocolType != "consumer" {
		t.Fatalf("anchored group's protocol type on the cluster is %q, want consumer", d.ProtocolType)
	}
	for recs.distinct() < n {
		time.Sleep(20 * time.Millisecond)
	}
	// Lag tools read the offsets from the cluster: they reach the end.
	s.assertCommittedAtEnd(ctx, group, topic)
	off, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}

	// A direct delete of the live group is refused.
	del, err := adm.DeleteGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if e := del[group].Err; !errors.Is(e, kerr.NonEmptyGroup) {
		t.Fatalf("direct DeleteGroups of a group kproxy serves: %v, want NON_EMPTY_GROUP", e)
	}
	// So is a direct OffsetDelete of its subscribed topic.
	dreq := kmsg.NewPtrOffsetDeleteRequest()
	dreq.Group = group
	dt := kmsg.NewOffsetDeleteRequestTopic()
	dt.Topic = topic
	for p := range int32(3) {
		dp := kmsg.NewOffsetDeleteRequestTopicPartition()
		dp.Partition = p
		dt.Partitions = append(dt.Partitions, dp)
	}
	dreq.Topics = append(dreq.Topics, dt)
	dresp, err := dreq.RequestWith(ctx, directClient(t, s))
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range dresp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != kerr.GroupSubscribedToTopic.Code {
				t.Fatalf("direct OffsetDelete of %s/%d: %v, want GROUP_SUBSCRIBED_TO_TOPIC", rt.Topic, rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
			}
		}
	}
	// Nothing was lost: the offsets are still there.
	after, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(3) {
		a, _ := off.Lookup(topic, p)
		b, _ := after.Lookup(topic, p)
		if a.At != b.At {
			t.Fatalf("p%d offset %d before the direct deletes, %d after", p, a.At, b.At)
		}
	}

	// The member leaves: kproxy's group is empty, the anchor leaves, and
	// the cluster's group is empty too; a direct delete now succeeds.
	m.leave()
	waitDirect(ctx, t, adm, group, "empty", func(d kadm.DescribedGroup) bool { return len(d.Members) == 0 })
	del, err = adm.DeleteGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if e := del[group].Err; e != nil {
		t.Fatalf("direct DeleteGroups of the emptied group: %v", e)
	}
	s.assertBrokersSawNoGroupTraffic()
}

// directClient is a client straight to the cluster.
func directClient(t testing.TB, s *stack) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestAnchorFencesStaleOwner: two stores anchor the same group (a stale
// owner and its successor). The successor's anchor replaces the stale
// one's in the cluster, whose commits (plain and transactional) are then
// refused with NOT_COORDINATOR and reported lost, while the successor's
// commits land under its own identity.
func TestAnchorFencesStaleOwner(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const group, topic = "fenced", "fenced-t"
	s.produce(ctx, topic, 2, 10)

	type loss struct {
		group string
		why   coexist.AnchorLoss
	}
	anchorsOf := map[*kafkastore.Store]*coexist.Anchors{}
	newStore := func(lost chan<- loss) *kafkastore.Store {
		st := kafkastore.New(directClient(t, s))
		as := coexist.EnableAnchors(st, coexist.AnchorOptions{
			SessionTimeout: 30 * time.Second,
			OnLost:         func(g string, why coexist.AnchorLoss) { lost <- loss{g, why} },
		})
		t.Cleanup(func() { as.Close(ctx, false) })
		anchorsOf[st] = as
		return st
	}
	spec := groupstate.Anchor{Members: 1, ProtocolType: "consumer", Protocols: []string{"range"},
		Topics: []string{topic}, Owned: map[string][]int32{topic: {0, 1}}}
	commit := func(st *kafkastore.Store, off int64) error {
		res, err := st.CommitOffsets(ctx, group, []kmsg.OffsetCommitRequestTopic{{Topic: topic,
			Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: off, LeaderEpoch: -1}}}})
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(res[0].Partitions[0].ErrorCode)
	}
	waitAnchored := func(st *kafkastore.Store) string {
		deadline := time.Now().Add(15 * time.Second)
		for {
			if id, _, ok := anchorsOf[st].AnchorIdentity(group); ok {
				return id
			}
			if time.Now().After(deadline) {
				t.Fatal("anchor never joined")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	lostA, lostB := make(chan loss, 4), make(chan loss, 4)
	a := newStore(lostA)
	if _, _, err := a.LoadGroupMetadata(ctx, group); err != nil {
		t.Fatal(err)
	}
	a.Anchor(group, spec)
	idA := waitAnchored(a)
	if err := commit(a, 3); err != nil {
		t.Fatalf("owner's anchored commit: %v", err)
	}

	// The successor takes the group over.
	b := newStore(lostB)
	if _, _, err := b.LoadGroupMetadata(ctx, group); err != nil {
		t.Fatalf("successor's load check: %v (the group is anchored, not live)", err)
	}
	b.Anchor(group, spec)
	idB := waitAnchored(b)
	if idA == idB {
		t.Fatal("the successor's anchor kept the stale member id")
	}
	if err := commit(b, 5); err != nil {
		t.Fatalf("successor's commit: %v", err)
	}

	// The stale owner's commit is fenced by the cluster.
	err := commit(a, 4)
	if !errors.Is(err, kerr.NotCoordinator) {
		t.Fatalf("stale owner's commit: %v, want NOT_COORDINATOR", err)
	}
	select {
	case l := <-lostA:
		if l.group != group || l.why != coexist.AnchorFenced {
			t.Fatalf("stale owner lost %v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stale owner was not told its anchor was lost")
	}
	// A stale transactional commit gets nowhere either.
	treq := kmsg.NewPtrTxnOffsetCommitRequest()
	treq.TransactionalID, treq.Group, treq.ProducerID, treq.ProducerEpoch = "app-txn", group, 1, 0
	treq.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: topic,
		Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1, LeaderEpoch: -1}}}}
	if _, err := a.TxnCommitOffsets(ctx, treq); !errors.Is(err, kerr.NotCoordinator) {
		t.Fatalf("stale owner's TxnOffsetCommit: %v, want NOT_COORDINATOR", err)
	}

	off, err := kadm.NewClient(directClient(t, s)).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := off.Lookup(topic, 0); o.At != 5 {
		t.Fatalf("committed offset %d, want the successor's 5", o.At)
	}
	select {
	case l := <-lostB:
		t.Fatalf("the successor lost its anchor: %v", l)
	default:
	}
}

// TestForwardLiveGroup: adoption of a running application. A member of a
// group the cluster coordinates keeps consuming directly while a second
// member joins through kproxy: kproxy forwards the group to the cluster's
// coordinator, so the two form one group (no partition owned twice, no
// anchor), and when the direct member leaves the other takes every
// partition over from the committed offsets; nothing is lost.
func TestForwardLiveGroup(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const group, topic, n = "adopted", "adopted-t", 600
	s.produce(ctx, topic, 4, n/2)
	own, recs := newOwnership(t), newRecords()
	// The cluster's coordinator takes sessions of 6 s and more.
	clusterSession := []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}
	direct := startMemberAt(t, s.cluster.ListenAddrs()[0], "direct", memberCfg{group: group, topic: topic, own: own, recs: recs, opts: clusterSession})
	waitOwners(t, own, 4, "direct")

	behind := s.startMember("behind", memberCfg{group: group, topic: topic, own: own, recs: recs, opts: clusterSession})
	waitOwners(t, own, 4, "direct", "behind")
	adm := directAdmin(t, s)
	d := waitDirect(ctx, t, adm, group, "two members", func(d kadm.DescribedGroup) bool { return len(d.Members) == 2 })
	for _, m := range d.Members {
		if m.InstanceID != nil {
			t.Fatalf("an anchor joined a group the cluster serves: %+v", m)
		}
	}
	s.produceRange(ctx, topic, n/2, n)
	direct.leave()
	own.releaseAll("direct")
	waitOwners(t, own, 4, "behind")
	deadline := time.Now().Add(30 * time.Second)
	for recs.distinct() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if miss := recs.missing(n); len(miss) > 0 {
		t.Fatalf("%d records never consumed, first %v", len(miss), miss[:min(5, len(miss))])
	}
	own.check()
	behind.leave()
	s.assertCommittedAtEnd(ctx, group, topic)
	if got := s.engine.Groups(); slices.ContainsFunc(got, func(g groupstate.GroupSnapshot) bool { return g.Group == group && len(g.Members) > 0 }) {
		t.Fatalf("kproxy's engine served the forwarded group: %+v", got)
	}
}

// TestAnchorsLeaveWithTheLastKproxy: kproxy removed at once (its members
// cut off, then kproxy stopped) takes its anchors out of the cluster's
// groups, in local mode and as the last kproxy of a fleet, so that the
// application's members, restarted against the brokers, get every
// partition at once instead of waiting for the anchors' sessions.
func TestAnchorsLeaveWithTheLastKproxy(t *testing.T) {
	for _, mode := range []kproxy.GroupsMode{kproxy.GroupsLocal, kproxy.GroupsDistributed} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			s := newStack(t, func(c *kproxy.Config) {
				c.Groups.Mode = mode
				c.Groups.Fleet.Name = "last-" + string(mode)
			})
			group, topic := "last-"+string(mode), "last-t-"+string(mode)
			s.produce(ctx, topic, 2, 50)
			own, recs := newOwnership(t), newRecords()
			m := s.startMember("m", memberCfg{group: group, topic: topic, own: own, recs: recs, opts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}})
			waitOwners(t, own, 2, "m")
			adm := directAdmin(t, s)
			waitDirect(ctx, t, adm, group, "anchored", func(d kadm.DescribedGroup) bool { return len(d.Members) == 1 })
			m.kill(own) // kproxy's group keeps the member until its session ends
			s.stop()
			d := describeDirect(ctx, t, adm, group)
			if len(d.Members) != 0 {
				t.Fatalf("after the last kproxy stopped the cluster's group still has %d members (%+v)", len(d.Members), d.Members)
			}
			// A member that now goes to the brokers directly gets every
			// partition from the committed offsets.
			direct := startMemberAt(t, s.cluster.ListenAddrs()[0], "direct", memberCfg{group: group, topic: topic, own: own, recs: recs,
				opts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}})
			waitOwners(t, own, 2, "direct")
			// What m had not consumed before it was cut off, the direct
			// member reads from the committed offsets.
			waitConsumed(t, recs, 50)
			direct.leave()
		})
	}
}

// TestAnchorThatCannotJoin: an anchor the cluster refuses (here a
// session timeout above the cluster's group.max.session.timeout.ms) does
// not stop the group's commits: after a few failed joins they are
// written without it, as with anchors off.
func TestAnchorThatCannotJoin(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const group, topic = "unanchorable", "unanchorable-t"
	s.produce(ctx, topic, 1, 1)
	st := kafkastore.New(directClient(t, s))
	as := coexist.EnableAnchors(st, coexist.AnchorOptions{SessionTimeout: 24 * time.Hour})
	t.Cleanup(func() { as.Close(ctx, false) })
	st.Anchor(group, groupstate.Anchor{Members: 1, ProtocolType: "consumer", Protocols: []string{"range"}, Topics: []string{topic}})
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := st.CommitOffsets(cctx, group, []kmsg.OffsetCommitRequestTopic{{Topic: topic,
		Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1, LeaderEpoch: -1}}}})
	if err != nil {
		t.Fatalf("commit with an anchor that cannot join: %v", err)
	}
	if code := res[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("commit with an anchor that cannot join: %v", kerr.ErrorForCode(code))
	}
	if _, _, ok := as.AnchorIdentity(group); ok {
		t.Fatal("the anchor joined with a session timeout the cluster refuses")
	}
}

// TestRollbackMemberByMember: an application moved back off kproxy one
// member at a time. The first member that reaches the brokers directly
// joins the cluster's group beside the anchor; kproxy hands the group
// back within the rebalance that join started: its engine's member
// follows the direct one into the cluster's group (its JoinGroup
// forwarded with an id of the cluster's), the anchor leaves, and the
// cluster completes one rebalance with both members, so the direct
// member gets partitions at once instead of idling until the last member
// left kproxy. No partition is ever owned twice, the committed offsets
// never go backwards and nothing is lost. Then the whole run again with
// cooperative members, and with static cooperative ones: b stops
// without leaving (static members do not), so kproxy's group still
// lists it when b-direct, of b's instance id, joins the cluster's: the
// hand-back must count b as arrived by its instance id, not wait for
// its session.
func TestRollbackMemberByMember(t *testing.T) {
	for _, balancer := range []string{"eager", "cooperative", "static"} {
		t.Run(balancer, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := newStack(t)
			group, topic := "rollback-"+balancer, "rollback-t-"+balancer
			const n = 900
			s.produce(ctx, topic, 4, n/3)
			opts := []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}
			if balancer == "eager" {
				opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
			}
			own, recs := newOwnership(t), newRecords()
			watch := watchOffsets(ctx, t, s.cluster.ListenAddrs(), topic, group)
			mc := func(instance string) memberCfg {
				o := opts
				if balancer == "static" {
					o = append(slices.Clone(opts), kgo.InstanceID(instance))
				}
				return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: o}
			}
			a := s.startMember("a", mc("a"))
			b := s.startMember("b", mc("b"))
			waitOwners(t, own, 4, "a", "b")
			adm := directAdmin(t, s)
			waitDirect(ctx, t, adm, group, "anchored", func(d kadm.DescribedGroup) bool { return len(d.Members) == 1 })

			// b goes back to the brokers: kproxy hands the group back,
			// a follows b-direct into the cluster's group.
			b.leave()
			own.releaseAll("b")
			moved := time.Now()
			b2 := startMemberAt(t, s.cluster.ListenAddrs()[0], "b-direct", mc("b"))
			waitOwners(t, own, 4, "a", "b-direct")
			took := time.Since(moved)
			t.Logf("handed back: a and b-direct share the partitions %s after b-direct started", took.Round(time.Millisecond))
			if balancer == "static" && took > 5*time.Second {
				// b's session is 6 s, the hand-back's bound 10 s.
				t.Fatalf("the hand-back took %s: it waited for the static member b, whose instance id b-direct holds in the cluster's group", took)
			}
			// A static b-direct is handed b's partitions at once by the
			// anchor's join (docs/anchors.md), so the cluster's group is
			// Stable with the anchor and b-direct for a moment first.
			waitDirect(ctx, t, adm, group, "a and b-direct in the cluster's group, the anchor gone", func(d kadm.DescribedGroup) bool {
				return len(d.Members) == 2 && d.State == "Stable" && !slices.ContainsFunc(d.Members, isAnchorMember)
			})
			// The engine drops the group once the anchor has left (the
			// anchor's loss is reported asynchronously), so within a
			// moment of the cluster's group settling, not before it.
			waitUntil(t, 5*time.Second, "kproxy's engine to drop the members of the group handed back", func() bool {
				g, ok := s.kproxy.Engine().Group(group)
				return !ok || len(g.Members) == 0
			})
			s.produceRange(ctx, topic, n/3, 2*n/3)

			// a goes back too: a plain rebalance of the cluster's group.
			a.leave()
			own.releaseAll("a")
			a2 := startMemberAt(t, s.cluster.ListenAddrs()[0], "a-direct", mc("a"))
			waitOwners(t, own, 4, "a-direct", "b-direct")
			s.produceRange(ctx, topic, 2*n/3, n)
			deadline := time.Now().Add(30 * time.Second)
			for recs.distinct() < n && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if miss := recs.missing(n); len(miss) > 0 {
				t.Fatalf("%d records never consumed, first %v", len(miss), miss[:min(5, len(miss))])
			}
			a2.leave()
			b2.leave()
			own.check()
			watch.check(t)
		})
	}
}
