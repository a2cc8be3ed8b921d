package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kproxy/kproxy/codec"
	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// Share groups served by kproxy itself (--share-groups serve) in front of
// an in-memory cluster whose share-group APIs are hidden, as on a
// cluster that lacks them (Kafka 3.x, or 4.x with share groups off).

// noShareCluster hides the cluster's share-group APIs.
func noShareCluster() []kfake.Opt {
	v := kversion.Stable()
	for _, k := range []int16{codec.KeyShareGroupHeartbeat, codec.KeyShareGroupDescribe, codec.KeyShareFetch, codec.KeyShareAcknowledge,
		codec.KeyDescribeShareGroupOffsets, codec.KeyAlterShareGroupOffsets, codec.KeyDeleteShareGroupOffsets} {
		v.SetMaxKeyVersion(k, -1)
	}
	return []kfake.Opt{kfake.MaxVersions(v)}
}

// newShareStack starts kproxy serving share groups from the earliest
// offset in front of a cluster without them, with a 6 s member session
// (Kafka's 45 s would make the tests that kill a member slow).
func newShareStack(t *testing.T, opts ...stackOpt) *stack {
	t.Helper()
	base := func(c *kproxy.Config) {
		c.Groups.ServeShares = true
		c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{AutoOffsetReset: "earliest", SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second}
		}
	}
	return newStackOn(t, noShareCluster(), append([]stackOpt{base}, opts...)...)
}

// shareLedger records every delivery of a share group's records and what
// the consumers acknowledged, to check KIP-932's guarantees from the
// clients' side.
type shareLedger struct {
	mu         sync.Mutex
	deliveries map[string][]int32   // value -> delivery counts seen, in order
	accepted   map[string]time.Time // value -> when its accept was answered OK
	finalCount map[string]int32     // value -> the delivery accepted or rejected
	rejected   map[string]time.Time // value -> when its reject was answered OK
	violations []string
	errs       []error
	byMember   map[string]int // client id -> deliveries
	// ambiguous holds the records whose accept or reject failed: the
	// coordinator may have stored it before the failure (an owner
	// killed after its write, before its answer), so such a record may
	// never come back.
	ambiguous map[string]bool
	// slack is how many deliveries a record may have been handed out
	// again before its accept or reject was answered without the
	// consumer having polled them yet: 0, except across an owner's
	// failover (1), where the next owner hands out again what the lost
	// one had handed out, possibly to the same member, whose
	// acknowledgement of its old copy then settles the new one
	// (acknowledgements name offsets, not deliveries).
	slack int32
	// settled, when set, must also hold for the consumers to stop once
	// every record is final or ambiguous: the coordinator's own view
	// (an ambiguous record it did not store comes back).
	settled func() bool
}

// unsettledLocked counts the ambiguous records that did not reach a
// final state since; l.mu is held.
func (l *shareLedger) unsettledLocked() int {
	n := 0
	for v := range l.ambiguous {
		if _, ok := l.accepted[v]; ok {
			continue
		}
		if _, ok := l.rejected[v]; ok {
			continue
		}
		n++
	}
	return n
}

func newShareLedger() *shareLedger {
	return &shareLedger{deliveries: map[string][]int32{}, accepted: map[string]time.Time{}, finalCount: map[string]int32{}, rejected: map[string]time.Time{}, byMember: map[string]int{}, ambiguous: map[string]bool{}}
}

// final counts the records accepted or rejected, answered OK.
func (l *shareLedger) final() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.accepted) + len(l.rejected)
}

// deliver records one delivery; a record delivered after its accept or
// reject was answered OK is a violation. The coordinator numbers a
// record's deliveries, so a delivery numbered below the one accepted
// was handed out before the accept and only polled after it (a client
// polls what it fetched earlier; across an owner's failover the record
// can be out twice): that is not a delivery after the accept.
func (l *shareLedger) deliver(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, c := string(r.Value), r.DeliveryCount()
	l.deliveries[v] = append(l.deliveries[v], c)
	if at, ok := l.accepted[v]; ok && c > l.finalCount[v]+l.slack {
		l.violations = append(l.violations, fmt.Sprintf("record %s delivered again (delivery %d) after its accept of delivery %d was answered at %v", v, c, l.finalCount[v], at))
	}
	if at, ok := l.rejected[v]; ok && c > l.finalCount[v]+l.slack {
		l.violations = append(l.violations, fmt.Sprintf("record %s delivered again (delivery %d) after its reject of delivery %d was answered at %v", v, c, l.finalCount[v], at))
	}
}

// shareAction is what a consumer does with a record on its delivery
// (1 for the first).
type shareAction func(value string, delivery int32) kgo.AckStatus

// consumeShareLedger runs members share consumers of group through addr
// until every one of n records reached a final state in the ledger
// (accepted or rejected, answered OK) or within passes. Each poll's
// records get act's status, then the acknowledgements are flushed and
// their results entered in the ledger.
func consumeShareLedger(t *testing.T, addr, group, topic string, members, n int, within time.Duration, act shareAction) *shareLedger {
	t.Helper()
	l := newShareLedger()
	consumeShareLedgerOn(t, l, []string{addr}, group, topic, members, n, within, act)
	return l
}

// consumeShareLedgerOn is consumeShareLedger into l, with member i
// connected to addrs[i%len(addrs)].
func consumeShareLedgerOn(t *testing.T, l *shareLedger, addrs []string, group, topic string, members, n int, within time.Duration, act shareAction) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	final := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		if got := len(l.accepted) + len(l.rejected) + l.unsettledLocked(); got < n || (l.settled != nil && !l.settled()) {
			return min(got, n-1)
		}
		cancel() // every record is final: wake the other consumers' polls
		return n
	}
	var wg sync.WaitGroup
	for i := range members {
		var results []kgo.ShareAckResult
		var rmu sync.Mutex
		name := "ledger-" + strconv.Itoa(i)
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs[i%len(addrs)]), kgo.ClientID(name), kgo.WithLogger(clientLogger(name, time.Now())),
			kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
			kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
				rmu.Lock()
				results = append(results, rs...)
				rmu.Unlock()
			}))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for ctx.Err() == nil && final() < n {
				fs := cl.PollRecords(ctx, 100)
				if ctx.Err() != nil {
					return
				}
				fs.EachError(func(_ string, _ int32, err error) {
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
				})
				type marked struct {
					value  string
					status kgo.AckStatus
					part   int32
					count  int32
				}
				var ms []marked
				fs.EachRecord(func(r *kgo.Record) {
					l.deliver(r)
					l.mu.Lock()
					l.byMember[name]++
					l.mu.Unlock()
					st := act(string(r.Value), r.DeliveryCount())
					r.Ack(st)
					ms = append(ms, marked{string(r.Value), st, r.Partition, r.DeliveryCount()})
				})
				if len(ms) == 0 {
					continue
				}
				rmu.Lock()
				results = results[:0]
				rmu.Unlock()
				fctx, fcancel := context.WithTimeout(context.Background(), 15*time.Second)
				err := cl.FlushAcks(fctx)
				fcancel()
				if err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, fmt.Errorf("flushing acks: %w", err))
					l.mu.Unlock()
					return
				}
				rmu.Lock()
				failed := map[int32]bool{}
				for _, r := range results {
					if r.Err != nil {
						failed[r.Partition] = true
						l.mu.Lock()
						l.errs = append(l.errs, fmt.Errorf("ack of p%d: %w", r.Partition, r.Err))
						l.mu.Unlock()
					}
				}
				rmu.Unlock()
				now := time.Now()
				l.mu.Lock()
				for _, m := range ms {
					if failed[m.part] {
						if m.status == kgo.AckAccept || m.status == kgo.AckReject {
							l.ambiguous[m.value] = true
						}
						continue
					}
					switch m.status {
					case kgo.AckAccept:
						l.accepted[m.value], l.finalCount[m.value] = now, m.count
					case kgo.AckReject:
						l.rejected[m.value], l.finalCount[m.value] = now, m.count
					}
				}
				l.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// waitShareStarts waits until every share-partition of group in the
// engine starts at the end of its log: every record reached a final
// state.
func waitShareStarts(t *testing.T, s *stack, group, topic string, partitions int) {
	t.Helper()
	ends, err := kadm.NewClient(directClient(t, s)).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		states, ok := s.engine.ShareStates(group)
		done := ok && len(states) == partitions
		for _, st := range states {
			end, _ := ends.Lookup(topic, st.TP.Partition)
			if st.StartOffset != end.Offset {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("share-partitions of %s did not reach the log ends %v: %+v", group, ends, states)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestShareGroupsServed: two franz-go share consumers of one group read
// a topic, accepting most records, releasing some on their first
// delivery and rejecting others; directly against an in-memory cluster
// that serves share groups, and through kproxy serving them in front of
// one that does not, in the same run. On both paths every record ends
// accepted or rejected, no record is delivered again after its accept
// or reject was answered, a released record comes back with its
// delivery count raised; through kproxy every share-partition's start
// offset then reaches the end of its log.
func TestShareGroupsServed(t *testing.T) {
	const n, partitions = 900, 3
	act := func(v string, delivery int32) kgo.AckStatus {
		switch {
		case strings.HasSuffix(v, "3") && delivery == 1:
			return kgo.AckRelease
		case strings.HasSuffix(v, "7"):
			return kgo.AckReject
		}
		return kgo.AckAccept
	}
	check := func(t *testing.T, l *shareLedger) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, v := range l.violations {
			t.Error(v)
		}
		if len(l.errs) > 0 {
			t.Errorf("consumers saw errors: %v", l.errs)
		}
		if got := len(l.accepted) + len(l.rejected); got != n {
			t.Fatalf("%d of %d records reached a final state (%d delivered)", got, n, len(l.deliveries))
		}
		for v, ds := range l.deliveries {
			for i, d := range ds {
				if d != int32(i+1) {
					t.Errorf("record %s: deliveries %v, want counts 1, 2, ...", v, ds)
					break
				}
			}
			if strings.HasSuffix(v, "3") && len(ds) < 2 {
				t.Errorf("record %s released on its first delivery was delivered %d times", v, len(ds))
			}
		}
	}
	ctx := context.Background()
	t.Run("direct", func(t *testing.T) {
		s := newStack(t)
		topic, group := "direct-share", "direct-share-g"
		setShareReset(ctx, t, directClient(t, s), group)
		s.produceEvenly(ctx, topic, partitions, n)
		start := time.Now()
		l := consumeShareLedger(t, s.cluster.ListenAddrs()[0], group, topic, 2, n, 60*time.Second, act)
		t.Logf("%d records final after %v", n, time.Since(start))
		check(t, l)
		// kfake answers DeleteGroups of a share group GROUP_ID_NOT_FOUND
		// (Kafka 4.4 deletes an empty one): not checked on this path.
		shareAdmin(t, s.cluster.ListenAddrs()[0], group, topic, partitions, n, false)
	})
	t.Run("kproxy", func(t *testing.T) {
		s := newShareStack(t)
		topic, group := "served-share", "served-share-g"
		s.produceEvenly(ctx, topic, partitions, n)
		start := time.Now()
		l := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 2, n, 60*time.Second, act)
		t.Logf("%d records final after %v", n, time.Since(start))
		check(t, l)
		waitShareStarts(t, s, group, topic, partitions)
		l.mu.Lock()
		defer l.mu.Unlock()
		c := s.engine.ShareCounters()
		if c.Acknowledged[1] < int64(len(l.accepted)) || c.Acknowledged[2] < int64(n/10) || c.Acknowledged[3] < int64(n/10) {
			t.Errorf("counters %+v: want at least %d accepted, %d released and %d rejected", c, len(l.accepted), n/10, n/10)
		}
		l.mu.Unlock()
		shareAdmin(t, s.kproxy.Addr(), group, topic, partitions, n, true)
		l.mu.Lock()
	})
}

// shareAdmin checks what kafka-share-groups does through addr once every
// record of group was accepted or rejected and its members left: the
// group is listed and described as an empty share group, every
// share-partition starts at its log's end; a reset to the start makes a
// new member read every record again; deleting the offsets, then (when
// deleteGroup) the group, works.
func shareAdmin(t *testing.T, addr, group, topic string, partitions, n int, deleteGroup bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// The members' leave heartbeats may still be on their way.
	var dg kadm.DescribedShareGroup
	for {
		d, err := adm.DescribeShareGroups(ctx, group)
		if err != nil {
			t.Fatalf("DescribeShareGroups: %v", err)
		}
		dg = d[group]
		if dg.Err != nil || len(dg.Members) == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if dg.Err != nil || dg.GroupState != "Empty" || dg.Assignor != "simple" {
		t.Errorf("described %s: state %q, assignor %q, err %v", group, dg.GroupState, dg.Assignor, dg.Err)
	}
	listed, err := adm.ListGroupsByType(ctx, []string{"share"})
	if err != nil || !slices.Contains(listed.Groups(), group) {
		t.Errorf("ListGroups of type share: %v, %v", listed.Groups(), err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil || offs[group].Err != nil {
		t.Fatalf("DescribeShareGroupOffsets: %v %v", err, offs[group].Err)
	}
	for p := range int32(partitions) {
		o, ok := offs[group].Offsets.Lookup(topic, p)
		end, _ := ends.Lookup(topic, p)
		if !ok || o.Err != nil || o.StartOffset != end.Offset {
			t.Errorf("share offset of p%d: %+v (found %v), want the end %d", p, o, ok, end.Offset)
		}
	}
	reset := kadm.Offsets{}
	for p := range int32(partitions) {
		reset.Add(kadm.Offset{Topic: topic, Partition: p, At: 0})
	}
	altered, err := adm.AlterShareGroupOffsets(ctx, group, reset)
	if err != nil {
		t.Fatalf("AlterShareGroupOffsets: %v", err)
	}
	for p := range int32(partitions) {
		if e, _ := altered.Lookup(topic, p); e != nil {
			t.Errorf("reset of p%d: %v", p, e)
		}
	}
	again := consumeShareLedger(t, addr, group, topic, 1, n, 30*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	again.mu.Lock()
	if len(again.accepted) != n {
		t.Errorf("after the reset a member accepted %d of %d records", len(again.accepted), n)
	}
	again.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, _ := adm.DescribeShareGroups(ctx, group)
		if len(d[group].Members) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	deleted, err := adm.DeleteShareGroupOffsets(ctx, group, topic)
	if err != nil {
		t.Fatalf("DeleteShareGroupOffsets: %v", err)
	}
	if e, _ := deleted.Lookup(topic); e != nil {
		t.Errorf("DeleteShareGroupOffsets of %s: %v", topic, e)
	}
	if !deleteGroup {
		return
	}
	dr, err := adm.DeleteGroups(ctx, group)
	if err != nil || dr[group].Err != nil {
		t.Errorf("DeleteGroups: %v %v", err, dr[group].Err)
	}
	if d, _ := adm.DescribeShareGroups(ctx, group); d[group].Err == nil {
		t.Errorf("after DeleteGroups %s is still described: %+v", group, d[group])
	}
}

// TestShareGroupsServedSurviveRestart: a member accepts the records of
// its first polls and holds the next ones unacknowledged when kproxy
// stops; after kproxy starts again (its share state reloaded from the
// cluster), a new member of the group gets every other record, never one
// whose accept was answered before the stop, and the records held at the
// stop come back with their delivery count raised.
func TestShareGroupsServedSurviveRestart(t *testing.T) {
	t.Parallel()
	s := newShareStack(t)
	shareSurvivesRestart(t, s, func() {
		// On fresh ports: a broker listener's port (the bootstrap port
		// plus one plus the node id) may meanwhile be some
		// connection's ephemeral port.
		s.listen = "127.0.0.1:0"
		s.start()
	})
}

// shareSurvivesRestart consumes part of a share group's records through
// s, accepting some and holding others, stops kproxy, calls restart
// (which starts it again) and checks from the ledger that the group
// went on where it was: nothing accepted delivered again, the held
// records delivered again with a higher count, every record accepted.
func shareSurvivesRestart(t *testing.T, s *stack, restart func()) {
	t.Helper()
	ctx := context.Background()
	const n, partitions = 300, 3
	topic, group := "restart-share", "restart-share-g"
	s.produceEvenly(ctx, topic, partitions, n)

	l := newShareLedger()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()), kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.ShareMaxRecords(20))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	held := map[string]bool{}
	for len(l.accepted) < 60 && pctx.Err() == nil {
		fs := cl.PollRecords(pctx, 20)
		fs.EachRecord(func(r *kgo.Record) { l.deliver(r); r.Ack(kgo.AckAccept) })
		if err := cl.FlushAcks(pctx); err != nil {
			t.Fatalf("flushing acks: %v", err)
		}
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) { l.accepted[string(r.Value)] = now })
	}
	for len(held) == 0 && pctx.Err() == nil {
		fs := cl.PollRecords(pctx, 20)
		fs.EachRecord(func(r *kgo.Record) { l.deliver(r); held[string(r.Value)] = true })
	}
	if pctx.Err() != nil {
		t.Fatalf("first member: %d accepted, %d held before the deadline", len(l.accepted), len(held))
	}
	s.stop() // the member's records are neither acknowledged nor released
	cl.Close()
	restart()

	rest := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, n-len(l.accepted), 60*time.Second,
		func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	rest.mu.Lock()
	defer rest.mu.Unlock()
	for v, ds := range rest.deliveries {
		if _, ok := l.accepted[v]; ok {
			t.Errorf("record %s delivered after kproxy's restart though its accept was answered before", v)
		}
		if held[v] && ds[0] < 2 {
			t.Errorf("record %s held at the stop came back with delivery count %d, want 2 or more", v, ds[0])
		}
	}
	if got := len(rest.accepted) + len(l.accepted); got != n {
		t.Fatalf("%d of %d records accepted (%d before the restart, %d after; errors %v)", got, n, len(l.accepted), len(rest.accepted), rest.errs)
	}
	for _, v := range rest.violations {
		t.Error(v)
	}
	rest.mu.Unlock()
	waitShareStarts(t, s, group, topic, partitions)
	rest.mu.Lock()
}

// killableDialer dials for one client until kill, which cuts every
// connection it made and refuses new ones: to kproxy the client is gone
// as a SIGKILLed process is.
type killableDialer struct {
	mu     sync.Mutex
	conns  []net.Conn
	killed bool
}

func (d *killableDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.killed {
		return nil, errors.New("killed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.killed = true
	for _, c := range d.conns {
		c.Close()
	}
}

// TestShareGroupsServedMemberKilled: a member that acquired records and
// dies without a word (its connections cut, no acknowledgement, no
// leave) loses them: another member of the group gets every record, the
// dead member's with their delivery count raised, once its connections'
// share sessions end and its session times out.
func TestShareGroupsServedMemberKilled(t *testing.T) {
	s := newShareStack(t)
	ctx := context.Background()
	const n, partitions = 300, 3
	topic, group := "killed-share", "killed-share-g"
	s.produceEvenly(ctx, topic, partitions, n)

	d := &killableDialer{}
	a, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()), kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.Dialer(d.dial))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	held := map[string]bool{}
	for len(held) < n/3 && pctx.Err() == nil {
		a.PollRecords(pctx, 0).EachRecord(func(r *kgo.Record) { held[string(r.Value)] = true })
	}
	if len(held) == 0 {
		t.Fatal("the first member got no record")
	}
	d.kill()

	start := time.Now()
	l := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, n, 60*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	t.Logf("the dead member held %d records; the other accepted all %d after %v", len(held), n, time.Since(start))
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.accepted) != n {
		t.Fatalf("%d of %d records accepted after the member died (errors %v)", len(l.accepted), n, l.errs)
	}
	for v := range held {
		if ds := l.deliveries[v]; len(ds) == 0 || ds[0] < 2 {
			t.Errorf("record %s held by the dead member was delivered with counts %v, want 2 or more", v, ds)
		}
	}
	for _, v := range l.violations {
		t.Error(v)
	}
}

// TestShareGroupsServedReadCommitted: with share.isolation.level
// read_committed a share group gets the records of committed
// transactions and never one of an aborted transaction (Kafka archives
// them at acquisition); with read_uncommitted it gets both.
func TestShareGroupsServedReadCommitted(t *testing.T) {
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprintf("read_committed=%v", committed), func(t *testing.T) {
			s := newShareStack(t, func(c *kproxy.Config) {
				c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
					return groupstate.ShareSettings{AutoOffsetReset: "earliest", ReadCommitted: committed}
				}
			})
			ctx := context.Background()
			topic, group := "txn-share", "txn-share-g"
			if _, err := kadm.NewClient(directClient(t, s)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
				t.Fatal(err)
			}
			p, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()), kgo.DefaultProduceTopic(topic), kgo.TransactionalID("txn-share-p"))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			const txns, per = 10, 10
			for i := range txns {
				if err := p.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				for j := range per {
					v := fmt.Sprintf("c-%d-%d", i, j)
					if i%2 == 1 {
						v = fmt.Sprintf("a-%d-%d", i, j)
					}
					if err := p.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
				if err := p.EndTransaction(ctx, kgo.TransactionEndTry(i%2 == 0)); err != nil {
					t.Fatal(err)
				}
			}
			want := txns / 2 * per // committed records
			if !committed {
				want = txns * per
			}
			l := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, want, 30*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
			l.mu.Lock()
			defer l.mu.Unlock()
			aborted := 0
			for v := range l.deliveries {
				if strings.HasPrefix(v, "a-") {
					aborted++
				}
			}
			if committed && aborted > 0 {
				t.Errorf("read_committed delivered %d records of aborted transactions", aborted)
			}
			if len(l.accepted) != want {
				t.Fatalf("accepted %d of %d records (errors %v)", len(l.accepted), want, l.errs)
			}
			l.mu.Unlock()
			waitShareStarts(t, s, group, topic, 1)
			l.mu.Lock()
		})
	}
}

// TestShareGroupsServedLogStartMoves: records deleted from under a
// share-partition's start (retention, DeleteRecords) are skipped: the
// share-partition moves to the log's new start, as Kafka's does.
func TestShareGroupsServedLogStartMoves(t *testing.T) {
	s := newShareStack(t)
	ctx := context.Background()
	topic, group := "deleted-share", "deleted-share-g"
	s.produceEvenly(ctx, topic, 1, 10)
	first := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, 10, 20*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	first.mu.Lock()
	accepted := len(first.accepted)
	first.mu.Unlock()
	if accepted != 10 {
		t.Fatalf("first member accepted %d of 10 records", accepted)
	}
	s.produceRange(ctx, topic, 10, 100)
	adm := kadm.NewClient(directClient(t, s))
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 80})
	if resp, err := adm.DeleteRecords(ctx, offs); err != nil || resp.Error() != nil {
		t.Fatalf("DeleteRecords: %v %v", err, resp.Error())
	}
	rest := consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, 20, 20*time.Second,
		func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	rest.mu.Lock()
	for v := range rest.deliveries {
		if i, _ := strconv.Atoi(v); i < 80 {
			t.Errorf("record %s below the log's new start was delivered", v)
		}
	}
	if len(rest.accepted) != 20 {
		t.Errorf("accepted %d of the 20 records left in the log", len(rest.accepted))
	}
	rest.mu.Unlock()
	waitShareStarts(t, s, group, topic, 1)
}

// TestShareGroupsAuto: --share-groups auto serves share groups in front of
// a cluster that lacks them and forwards them to a cluster that serves
// them; a share consumer reads every record either way.
func TestShareGroupsAuto(t *testing.T) {
	for _, lacks := range []bool{true, false} {
		t.Run(fmt.Sprintf("cluster_lacks_shares=%v", lacks), func(t *testing.T) {
			var clusterOpts []kfake.Opt
			if lacks {
				clusterOpts = noShareCluster()
			}
			s := newStackOn(t, clusterOpts, func(c *kproxy.Config) { c.Groups.SharesAuto = true })
			ctx := context.Background()
			topic, group := "auto-share", "auto-share-g"
			if !lacks {
				setShareReset(ctx, t, directClient(t, s), group)
			}
			// Produced once the member has joined and fetched: kproxy's
			// groups start at the log's end by default.
			done := make(chan *shareLedger, 1)
			if _, err := kadm.NewClient(directClient(t, s)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
				t.Fatal(err)
			}
			go func() {
				done <- consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, 50, 30*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
			}()
			deadline := time.Now().Add(10 * time.Second)
			for lacks && time.Now().Before(deadline) {
				if st, ok := s.engine.ShareStates(group); ok && len(st) == 1 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			s.produceRange(ctx, topic, 0, 50)
			l := <-done
			l.mu.Lock()
			defer l.mu.Unlock()
			if len(l.accepted) != 50 {
				t.Fatalf("accepted %d of 50 records (errors %v)", len(l.accepted), l.errs)
			}
			_, served := s.engine.ShareStates(group)
			if served != lacks {
				t.Errorf("kproxy served the share group: %v, want %v", served, lacks)
			}
		})
	}
}

// TestShareGroupsServedTopicGrows: partitions added to a topic a share
// group reads start at the log's start, as Kafka starts them, whatever
// share.auto.offset.reset says (latest here): records written to them
// before the group's members see them are delivered.
func TestShareGroupsServedTopicGrows(t *testing.T) {
	s := newShareStack(t, func(c *kproxy.Config) {
		c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{AutoOffsetReset: "latest", HeartbeatInterval: time.Second}
		}
	})
	ctx := context.Background()
	topic, group := "grow-share", "grow-share-g"
	adm := kadm.NewClient(directClient(t, s))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	done := make(chan *shareLedger, 1)
	go func() {
		done <- consumeShareLedger(t, s.kproxy.Addr(), group, topic, 1, 90, 60*time.Second, func(string, int32) kgo.AckStatus { return kgo.AckAccept })
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st, ok := s.engine.ShareStates(group); ok && len(st) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the member did not start reading the topic")
		}
		time.Sleep(50 * time.Millisecond)
	}
	prod := s.client(kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	s.produceWith(ctx, prod, 0, 30)
	if _, err := adm.CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	// Records on all three partitions before the member sees the new ones.
	prod2 := s.client(kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.MetadataMinAge(10*time.Millisecond))
	for deadline := time.Now().Add(5 * time.Second); ; {
		md, err := kadm.NewClient(prod2).Metadata(ctx, topic)
		if err == nil && len(md.Topics[topic].Partitions) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the topic has not grown to 3 partitions: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	prod2.ForceMetadataRefresh()
	s.produceWith(ctx, prod2, 30, 90)
	l := <-done
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.accepted) != 90 {
		t.Fatalf("accepted %d of 90 records (errors %v)", len(l.accepted), l.errs)
	}
}

// TestShareGroupsServedRenew: a member renews the locks of records it
// holds (KIP-1222, ShareFetch/ShareAcknowledge v2 with IsRenewAck) and
// can still accept them after their first lock would have run out: no
// lock times out. Without the renew their locks time out (the client,
// which keeps fetching, may acquire them again).
func TestShareGroupsServedRenew(t *testing.T) {
	t.Parallel()
	for _, renew := range []bool{true, false} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			s := newShareStack(t, func(c *kproxy.Config) {
				c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
					return groupstate.ShareSettings{AutoOffsetReset: "earliest", LockDuration: 3 * time.Second}
				}
			})
			ctx := context.Background()
			topic, group := "renew-share", "renew-share-g"
			s.produceEvenly(ctx, topic, 1, 10)
			var mu sync.Mutex
			var results []kgo.ShareAckResult
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()), kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
				kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
					mu.Lock()
					results = append(results, rs...)
					mu.Unlock()
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var recs []*kgo.Record
			for len(recs) < 10 && pctx.Err() == nil {
				recs = append(recs, cl.PollRecords(pctx, 10).Records()...)
			}
			if len(recs) < 10 {
				t.Fatalf("got %d of 10 records", len(recs))
			}
			flush := func() []kgo.ShareAckResult {
				mu.Lock()
				results = nil
				mu.Unlock()
				if err := cl.FlushAcks(pctx); err != nil {
					t.Fatalf("flushing acks: %v", err)
				}
				mu.Lock()
				defer mu.Unlock()
				return append([]kgo.ShareAckResult(nil), results...)
			}
			// 4 s in 1 s steps against 3 s locks: a renew at each step
			// leaves 2 s for it to arrive on a loaded machine.
			for range 4 {
				time.Sleep(time.Second)
				if renew {
					cl.MarkAcks(kgo.AckRenew, recs...)
					for _, r := range flush() {
						if r.Err != nil {
							t.Fatalf("renew of p%d: %v", r.Partition, r.Err)
						}
					}
				}
			}
			cl.MarkAcks(kgo.AckAccept, recs...)
			res := flush()
			failed := false
			for _, r := range res {
				failed = failed || r.Err != nil
			}
			if renew && (failed || len(res) == 0) {
				t.Fatalf("accept after renewing: %+v", res)
			}
			timeouts := s.engine.ShareCounters().LockTimeouts
			if renew && timeouts != 0 {
				t.Errorf("%d locks timed out though they were renewed", timeouts)
			}
			if !renew && timeouts < 10 {
				t.Errorf("%d locks timed out in 4 s of 3 s locks without a renew, want 10", timeouts)
			}
		})
	}
}

// TestShareGroupsServedAuthorized: with group authorization on, share
// groups kproxy serves follow the cluster's ACLs: a principal with READ
// on its group and on both topics gets every record; one with READ on
// one topic and DESCRIBE on the other (so that it sees the other in its
// metadata, subscribes to it and fetches it) gets none of the other's;
// one with DESCRIBE only on its group cannot join.
func TestShareGroupsServedAuthorized(t *testing.T) {
	t.Parallel()
	e := newAuthzEnvWith(t, kproxy.GroupsLocal, noShareCluster(), func(c *kproxy.Config) {
		c.Groups.ServeShares = true
		c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{AutoOffsetReset: "earliest"}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := e.client(t, e.cluster.ListenAddrs(), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism(), kgo.MaxVersions(nil))
	res, err := kadm.NewClient(admin).CreateACLs(ctx, kadm.NewACLs().Allow("User:dave").AllowHosts().Topics(e.topics[1]).Operations(kadm.OpDescribe))
	if err != nil || res[0].Err != nil {
		t.Fatalf("create acl: %v %v", err, res)
	}
	time.Sleep(2 * time.Second) // kproxy's ACL cache (1 s TTL) sees it
	const per = 20
	for _, topic := range e.topics {
		for i := range per {
			if err := admin.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("%s-%d", topic, i))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(t *testing.T, m sasl.Mechanism, group string, within time.Duration) (map[string]bool, []error) {
		t.Helper()
		cl := e.client(t, []string{e.kproxy.Addr()}, m, kgo.MaxVersions(nil), kgo.ShareGroup(group), kgo.ConsumeTopics(e.topics[:]...))
		got := map[string]bool{}
		var errs []error
		rctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		for len(got) < 2*per && rctx.Err() == nil {
			fs := cl.PollRecords(rctx, 0)
			fs.EachError(func(_ string, _ int32, err error) {
				if rctx.Err() == nil {
					errs = append(errs, err)
				}
			})
			fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)] = true })
		}
		return got, errs
	}
	t.Run("alice reads both topics", func(t *testing.T) {
		got, errs := read(t, mechPlain("alice", authzAlicePass), "alice-share", 20*time.Second)
		if len(got) != 2*per {
			t.Fatalf("alice read %d of %d records (errors %v)", len(got), 2*per, errs)
		}
	})
	t.Run("dave reads only the topic he may", func(t *testing.T) {
		got, errs := read(t, mechPlain("dave", authzDavePass), "dave-share", 5*time.Second)
		for v := range got {
			if strings.HasPrefix(v, e.topics[1]) {
				t.Fatalf("dave got %s of %s, which he may not read", v, e.topics[1])
			}
		}
		if len(got) != per {
			t.Errorf("dave read %d of the %d records of %s (errors %v)", len(got), per, e.topics[0], errs)
		}
		denied := false
		for _, err := range errs {
			denied = denied || errors.Is(err, kerr.TopicAuthorizationFailed)
		}
		if !denied {
			t.Errorf("dave was not told TOPIC_AUTHORIZATION_FAILED for %s: %v", e.topics[1], errs)
		}
	})
	t.Run("carol may not join", func(t *testing.T) {
		got, errs := read(t, scram.Auth{User: "carol", Pass: authzCarolPass}.AsSha512Mechanism(), "carol-share", 3*time.Second)
		if len(got) != 0 {
			t.Fatalf("carol read %d records with DESCRIBE only on her group", len(got))
		}
		denied := false
		for _, err := range errs {
			denied = denied || errors.Is(err, kerr.GroupAuthorizationFailed)
		}
		if !denied {
			t.Errorf("carol was not told GROUP_AUTHORIZATION_FAILED: %v", errs)
		}
	})
}
