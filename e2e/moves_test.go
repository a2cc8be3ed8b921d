package e2e

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The tests that time one move of a member through kproxy against the
// same move made directly, in the same run on the same cluster
// (TestHandBackAtDirectSpeed, TestPlainLeaveCost), start from the same
// three members.

// trio is three members, a, b and c, of a group of its own consuming a
// 6-partition topic of its own, all behind kproxy or all on the brokers.
type trio struct {
	a, b, c *member
	mc      memberCfg
	topic   string
	watch   *offsetWatch
	// static gives each member the instance id name-<member> (KIP-345).
	static bool
}

// trioRecords is how many records a trio's topic gets: half before the
// move, half after it.
const trioRecords = 600

// startTrio starts a trio named name (the group; its topic is name-t)
// behind kproxy (via "kproxy") or on the brokers ("direct"), its members
// heartbeating every second with the assignment of kind (cooperative,
// eager, static: eager ones with instance ids, or kip848: KIP-848's
// server-side one), and returns once it is
// settled: every partition owned, the cluster's group holding kproxy's
// anchor alone (through kproxy), no rebalance in flight. The caller
// makes the move, then calls finish.
func startTrio(ctx context.Context, t *testing.T, s *stack, name, kind, via string) *trio {
	t.Helper()
	topic := name + "-t"
	s.produce(ctx, topic, 6, trioRecords/2)
	opts := []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}
	switch kind {
	case "eager", "static":
		opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
	case "kip848":
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer())
	}
	tr := &trio{topic: topic, watch: watchOffsets(ctx, t, s.cluster.ListenAddrs(), topic, name),
		mc: memberCfg{group: name, topic: topic, own: newOwnership(t), recs: newRecords(), opts: opts}, static: kind == "static"}
	at := s.cluster.ListenAddrs()[0]
	if via == "kproxy" {
		at = s.addr()
	}
	tr.a = tr.start(t, at, "a", "a")
	tr.b = tr.start(t, at, "b", "b")
	tr.c = tr.start(t, at, "c", "c")
	waitOwners(t, tr.mc.own, 6, "a", "b", "c")
	if via == "kproxy" {
		waitDirect(ctx, t, directAdmin(t, s), name, "anchored", func(d kadm.DescribedGroup) bool { return len(d.Members) == 1 })
	}
	time.Sleep(500 * time.Millisecond) // settled: no rebalance in flight
	return tr
}

// start starts member name of tr at addr, as instance id
// <group>-<instance> when tr is static.
func (tr *trio) start(t *testing.T, addr, name, instance string) *member {
	t.Helper()
	mc := tr.mc
	if tr.static {
		mc.opts = append(slices.Clip(mc.opts), kgo.InstanceID(mc.group+"-"+instance))
	}
	return startMemberAt(t, addr, name, mc)
}

// finish produces the second half of the trio's records and checks
// that every record was consumed, no partition was owned twice and no
// committed offset went back; a and b leave.
func (tr *trio) finish(ctx context.Context, t *testing.T, s *stack) {
	t.Helper()
	defer tr.a.leave()
	defer tr.b.leave()
	s.produceRange(ctx, tr.topic, trioRecords/2, trioRecords)
	waitConsumed(t, tr.mc.recs, trioRecords)
	tr.mc.own.check()
	tr.watch.check(t)
}

// envCount returns the positive integer in environment variable name,
// or def.
func envCount(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
