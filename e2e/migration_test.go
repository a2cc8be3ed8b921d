package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// The tests of this file roll franz-go groups between the classic and
// the KIP-848 protocol through kproxy, one member at a time while records
// flow (issue 11, KIP-848's upgrade path): every record is consumed, no
// partition is ever held by two members at once nor given to two
// members at one generation or epoch, committed offsets carry over, and
// the group ends as the protocol rolled to.

// Member options of the rolls: the classic members' session outlasts
// nothing (3 s, so a static member that stops is expired quickly).
var (
	coopOpts   = []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond)}
	eagerOpts  = []kgo.Opt{kgo.Balancers(kgo.RangeBalancer()), kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond)}
	mixedOpts  = []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer(), kgo.RangeBalancer()), kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond)}
	rangeFirst = []kgo.Opt{kgo.Balancers(kgo.RangeBalancer(), kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond)}
	k848Opts   = []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}
)

// logEventsOnFailure logs the engine's events of group if the test
// fails.
func (s *stack) logEventsOnFailure(group string) {
	s.t.Cleanup(func() {
		if !s.t.Failed() {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, ev := range s.events {
			if ev.Group != group || ev.Kind == groupstate.EventOffsetsCommitted {
				continue
			}
			m := ""
			if ev.Member != nil {
				m = ev.Member.MemberID + " " + ev.Member.InstanceID + " " + ev.Member.Protocol
			}
			s.t.Logf("event %s %s generation %d %s cause %q member %s", ev.Time.Format("15:04:05.000"), ev.Kind, ev.Generation, ev.State, ev.Cause, m)
		}
	})
}

// static adds group.instance.id to opts.
func static(instance string, opts []kgo.Opt) []kgo.Opt {
	return append(slices.Clone(opts), kgo.InstanceID(instance))
}

// flow produces records "from", "from+1", … to topic through kproxy, one
// every few milliseconds, until stop, which returns how many were
// written (all acknowledged).
func (s *stack) flow(ctx context.Context, topic string, from int) (stop func() int) {
	s.t.Helper()
	cl := s.client(kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	n := from
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(itoa(n))}).FirstErr(); err != nil {
				if ctx.Err() == nil {
					s.t.Errorf("produce %d: %v", n, err)
				}
				return
			}
			n++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() int {
		cancel()
		wg.Wait()
		return n
	}
}

// roll is one step of a rolling restart: member from stops (leaving the
// group as its client does on Close) and its replacement starts.
type roll struct {
	from *member
	to   string
	cfg  memberCfg
	// waitExpired, for a static classic member restarted with the
	// KIP-848 protocol, waits until the group let its instance go: a
	// static classic member does not leave on Close (KIP-345), and
	// Kafka answers the new instance UNRELEASED_INSTANCE_ID until the
	// old one's session expired.
	waitExpired string
}

// rollAll runs steps one at a time, each time waiting until the
// partitions settle on the members then running, and returns them.
func (s *stack) rollAll(group string, parts int, own *ownership, running []*member, steps ...roll) []*member {
	s.t.Helper()
	for _, st := range steps {
		st.from.leave()
		if st.waitExpired != "" {
			s.waitInstanceGone(group, st.waitExpired)
		}
		next := s.startMember(st.to, st.cfg)
		var names []string
		var now []*member
		for _, m := range running {
			if m != st.from {
				now = append(now, m)
				names = append(names, m.name)
			}
		}
		running = append(now, next)
		waitOwners(s.t, own, parts, append(names, next.name)...)
		own.check()
		// As an operator rolls: the next instance once the group is
		// Stable again (every member at the group's generation or
		// epoch). A classic member still behind the epoch when the
		// group converts back is at a generation the classic group
		// does not know: its commits fail with ILLEGAL_GENERATION
		// until it rejoins, in Kafka as here.
		s.waitStable(group, len(running))
	}
	return running
}

// waitStable waits until group is a Stable group, of either type, of
// members members.
func (s *stack) waitStable(group string, members int) {
	s.t.Helper()
	cl := s.client()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var last string
	for ctx.Err() == nil {
		classic := groupTypeMismatch(ctx, cl, group, "classic", members)
		consumer := groupTypeMismatch(ctx, cl, group, "consumer", members)
		if classic == "" || consumer == "" {
			return
		}
		last = classic + "; " + consumer
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("group %s never became Stable with %d members: %s", group, members, last)
}

// waitInstanceGone waits until no member of group has instance id.
func (s *stack) waitInstanceGone(group, instance string) {
	s.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		snap, _ := s.engine.Group(group)
		if !slices.ContainsFunc(snap.Members, func(m groupstate.Member) bool { return m.InstanceID == instance }) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("instance %s never left group %s", instance, group)
}

// protocolsOf returns each member's protocol in the engine's view, by
// instance id (or member id when dynamic).
func (s *stack) protocolsOf(group string) (groupstate.GroupSnapshot, map[string]string) {
	s.t.Helper()
	snap, ok := s.engine.Group(group)
	if !ok {
		s.t.Fatalf("group %s is unknown to the engine", group)
	}
	out := map[string]string{}
	for _, m := range snap.Members {
		key := m.InstanceID
		if key == "" {
			key = m.MemberID
		}
		out[key] = m.Protocol
	}
	return snap, out
}

// assertGroupType waits until, through kproxy as a client sees it,
// group is a Stable classic group (DescribeGroups: protocol type
// consumer; ConsumerGroupDescribe: GROUP_ID_NOT_FOUND) or a Stable
// consumer group (the converse) of members members, and ListGroups v5
// names its type.
func (s *stack) assertGroupType(ctx context.Context, group, want string, members int) {
	s.t.Helper()
	cl := s.client()
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if last = groupTypeMismatch(ctx, cl, group, want, members); last == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("group %s is not a Stable %s group of %d: %s", group, want, members, last)
}

// groupTypeMismatch says how group differs from a Stable group of type
// want with members members, or "".
func groupTypeMismatch(ctx context.Context, cl *kgo.Client, group, want string, members int) string {
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups = []string{group}
	dresp, err := dg.RequestWith(ctx, cl)
	if err != nil {
		return "DescribeGroups: " + err.Error()
	}
	cg := kmsg.NewPtrConsumerGroupDescribeRequest()
	cg.Groups = []string{group}
	cresp, err := cg.RequestWith(ctx, cl)
	if err != nil {
		return "ConsumerGroupDescribe: " + err.Error()
	}
	d, c := dresp.Groups[0], cresp.Groups[0]
	switch want {
	case "classic":
		if d.ErrorCode != 0 || d.ProtocolType != "consumer" || d.State != "Stable" || len(d.Members) != members {
			return fmt.Sprintf("DescribeGroups: %v %q %q %d members", kerr.ErrorForCode(d.ErrorCode), d.ProtocolType, d.State, len(d.Members))
		}
		if c.ErrorCode != kerr.GroupIDNotFound.Code {
			return fmt.Sprintf("ConsumerGroupDescribe of a classic group: %v", kerr.ErrorForCode(c.ErrorCode))
		}
	case "consumer":
		if c.ErrorCode != 0 || c.State != "Stable" || len(c.Members) != members {
			return fmt.Sprintf("ConsumerGroupDescribe: %v %q %d members", kerr.ErrorForCode(c.ErrorCode), c.State, len(c.Members))
		}
		if d.ErrorCode != kerr.GroupIDNotFound.Code {
			return fmt.Sprintf("DescribeGroups of a consumer group: %v", kerr.ErrorForCode(d.ErrorCode))
		}
	}
	lg := kmsg.NewPtrListGroupsRequest()
	lg.Version = 5
	lresp, err := lg.RequestWith(ctx, cl)
	if err != nil {
		return "ListGroups: " + err.Error()
	}
	for _, g := range lresp.Groups {
		if g.Group == group && g.GroupType != want {
			return fmt.Sprintf("ListGroups names its type %q", g.GroupType)
		}
	}
	return ""
}

// TestRollingUpgradeClassicToConsumer rolls a group of three franz-go
// classic cooperative-sticky members, one at a time, to the KIP-848
// protocol (kgo.ServerSideBalancer) through kproxy while records flow:
// the group converts online when the first KIP-848 member joins, the
// classic members keep consuming inside it, and the group ends as a
// consumer group of KIP-848 members.
func TestRollingUpgradeClassicToConsumer(t *testing.T) {
	s := kip848Stack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, parts = "roll", "roll-group", 6
	s.produce(ctx, topic, parts, 300)
	own, recs := newOwnership(t), newRecords()
	s.logEventsOnFailure(group)
	classic := memberCfg{group: group, topic: topic, own: own, recs: recs, opts: coopOpts}
	consumer := memberCfg{group: group, topic: topic, own: own, recs: recs, opts: k848Opts}

	a := s.startMember("a", classic)
	b := s.startMember("b", classic)
	c := s.startMember("c", classic)
	waitOwners(t, own, parts, "a", "b", "c")
	waitConsumed(t, recs, 300)
	s.assertGroupType(ctx, group, "classic", 3)
	stop := s.flow(ctx, topic, 300)

	running := s.rollAll(group, parts, own, []*member{a, b, c}, roll{from: a, to: "a2", cfg: consumer})
	if len(s.eventsOf(groupstate.EventGroupConverted)) == 0 {
		t.Fatalf("no group_converted event after the first KIP-848 member joined")
	}
	running = s.rollAll(group, parts, own, running,
		roll{from: b, to: "b2", cfg: consumer},
		roll{from: c, to: "c2", cfg: consumer})

	total := stop()
	waitConsumed(t, recs, total)
	own.check()
	s.assertCommittedAtEnd(ctx, group, topic)
	s.assertGroupType(ctx, group, "consumer", 3)
	_, protos := s.protocolsOf(group)
	for id, p := range protos {
		if p != groupstate.MemberProtocolConsumer {
			t.Fatalf("member %s still speaks %s", id, p)
		}
	}
	for _, m := range running {
		m.leave()
	}
	s.assertBrokersSawNoGroupTraffic()
}

// TestRollingDowngradeConsumerToClassic rolls a consumer group of three
// franz-go KIP-848 members back to the classic protocol
// (cooperative-sticky), one at a time, while records flow. The last
// KIP-848 member is static: its classic replacement joins under the same
// group.instance.id and converts the group back to a classic group
// without a rebalance (Kafka's
// validateOnlineDowngradeWithReplacedMemberId); the group ends classic
// with the instance id kept. (franz-go's static leave, epoch -2, carries
// no instance id and is refused INVALID_REQUEST, by Kafka as by kproxy:
// the old member stays until its replacement takes it over, at once.)
func TestRollingDowngradeConsumerToClassic(t *testing.T) {
	s := kip848Stack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, parts = "unroll", "unroll-group", 6
	s.produce(ctx, topic, parts, 300)
	own, recs := newOwnership(t), newRecords()
	s.logEventsOnFailure(group)
	cfg := func(opts []kgo.Opt) memberCfg {
		return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts}
	}
	a := s.startMember("a", cfg(k848Opts))
	b := s.startMember("b", cfg(k848Opts))
	c := s.startMember("c", cfg(static("c", k848Opts)))
	waitOwners(t, own, parts, "a", "b", "c")
	waitConsumed(t, recs, 300)
	s.assertGroupType(ctx, group, "consumer", 3)
	stop := s.flow(ctx, topic, 300)

	running := s.rollAll(group, parts, own, []*member{a, b, c},
		roll{from: a, to: "a2", cfg: cfg(coopOpts)},
		roll{from: b, to: "b2", cfg: cfg(coopOpts)})
	snap, protos := s.protocolsOf(group)
	if protos["c"] != groupstate.MemberProtocolConsumer || len(snap.Members) != 3 {
		t.Fatalf("before the last step the group must hold KIP-848 member c and two classic members: %v", protos)
	}
	rebalances := len(s.eventsOf(groupstate.EventRebalanceStarted))
	running = s.rollAll(group, parts, own, running, roll{from: c, to: "c2", cfg: cfg(static("c", coopOpts))})

	total := stop()
	waitConsumed(t, recs, total)
	own.check()
	s.assertCommittedAtEnd(ctx, group, topic)
	s.assertGroupType(ctx, group, "classic", 3)
	snap, protos = s.protocolsOf(group)
	for id, p := range protos {
		if p != groupstate.MemberProtocolClassic {
			t.Fatalf("member %s still speaks %s", id, p)
		}
	}
	if _, ok := protos["c"]; !ok {
		t.Fatalf("the static member's instance id is gone: %v", protos)
	}
	converted := s.eventsOf(groupstate.EventGroupConverted)
	if len(converted) == 0 || converted[len(converted)-1].Cause != groupstate.CauseConvertedToClassic {
		t.Fatalf("no conversion to classic: %+v", converted)
	}
	for _, ev := range s.eventsOf(groupstate.EventRebalanceStarted)[rebalances:] {
		if ev.Cause == groupstate.CauseConvertedToClassic {
			t.Fatalf("the static replacement's downgrade started a rebalance: %+v", ev)
		}
	}
	for _, m := range running {
		m.leave()
	}
	s.assertBrokersSawNoGroupTraffic()
}

// TestRollingMigrationEagerAndStaticMembers rolls a classic group of an
// eager member (range only, static), a cooperative member and a static
// cooperative member (both offering cooperative-sticky and range, so the
// classic group agrees on range and all are eager) to the KIP-848
// protocol and back, one member at a time while records flow. Inside the
// consumer group each classic member follows its own first protocol, as
// Kafka answers it (the eager one revokes everything before rejoining,
// the cooperative ones only what moves). Static members restarted with
// the other protocol keep their group.instance.id.
//
// On the way back the eager member offers range first and
// cooperative-sticky second, so the classic group the downgrade leaves
// votes cooperative-sticky: a member that was cooperative must not find
// its group eager after a rebalance, since it learns that only with its
// JoinGroup answer and revokes after SyncGroup, while an eager member
// may be given its partitions in the same generation (KIP-429: going
// from cooperative back to eager takes two rolling bounces). Kafka has
// the same hazard; the test does not build it.
func TestRollingMigrationEagerAndStaticMembers(t *testing.T) {
	s := kip848Stack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const topic, group, parts = "mixroll", "mixroll-group", 6
	s.produce(ctx, topic, parts, 200)
	own, recs := newOwnership(t), newRecords()
	s.logEventsOnFailure(group)
	cfg := func(opts []kgo.Opt) memberCfg {
		return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts}
	}
	// The eager member first: if the cooperative ones formed the group
	// alone it would be cooperative, and its fall to eager when the
	// eager member joins is the hazard above.
	e := s.startMember("eager", cfg(static("e", eagerOpts)))
	waitOwners(t, own, parts, "eager")
	c := s.startMember("coop", cfg(mixedOpts))
	sc := s.startMember("static-coop", cfg(static("sc", mixedOpts)))
	waitOwners(t, own, parts, "eager", "coop", "static-coop")
	waitConsumed(t, recs, 200)
	s.assertGroupType(ctx, group, "classic", 3)
	if snap, _ := s.engine.Group(group); snap.Protocol != "range" {
		t.Fatalf("the classic group chose %q, want range (the one protocol every member offers)", snap.Protocol)
	}
	stop := s.flow(ctx, topic, 200)

	// Upgrade: the static classic members do not leave on Close, so
	// their new instances start once the group expired the old ones.
	running := s.rollAll(group, parts, own, []*member{e, c, sc},
		roll{from: c, to: "coop-848", cfg: cfg(k848Opts)},
		roll{from: e, to: "eager-848", cfg: cfg(static("e", k848Opts)), waitExpired: "e"},
		roll{from: sc, to: "static-coop-848", cfg: cfg(static("sc", k848Opts)), waitExpired: "sc"})
	s.assertGroupType(ctx, group, "consumer", 3)
	_, protos := s.protocolsOf(group)
	for _, inst := range []string{"e", "sc"} {
		if protos[inst] != groupstate.MemberProtocolConsumer {
			t.Fatalf("static member %s after the upgrade: %v", inst, protos)
		}
	}

	// Downgrade: the static KIP-848 members are replaced at once by
	// their classic instances; the eager one goes last and converts the
	// group back without a rebalance.
	running = s.rollAll(group, parts, own, running,
		roll{from: running[0], to: "coop-again", cfg: cfg(mixedOpts)},
		roll{from: running[2], to: "static-coop-again", cfg: cfg(static("sc", mixedOpts))},
		roll{from: running[1], to: "eager-again", cfg: cfg(static("e", rangeFirst))})

	total := stop()
	waitConsumed(t, recs, total)
	own.check()
	s.assertCommittedAtEnd(ctx, group, topic)
	s.assertGroupType(ctx, group, "classic", 3)
	snap, protos := s.protocolsOf(group)
	for _, inst := range []string{"e", "sc"} {
		if protos[inst] != groupstate.MemberProtocolClassic {
			t.Fatalf("static member %s after the downgrade: %v", inst, protos)
		}
	}
	if snap.Protocol != "cooperative-sticky" {
		t.Fatalf("the downgraded group uses %q, want cooperative-sticky (two votes of three)", snap.Protocol)
	}
	for _, m := range running {
		m.leave()
	}
	s.assertBrokersSawNoGroupTraffic()
}
