package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kproxy/kproxy/groupstate"
)

// TestPlainLeaveCost: what a leave nobody follows (a member stops for
// good) costs the members that stay, in a group anchored in the
// cluster's coordinator, against the same leave made directly, in the
// same run on the same cluster. In an anchored group kproxy holds a
// leave's partitions back for a member that may be moving to the
// brokers (docs/anchors.md, "Out (rollback)"): a classic leave's
// rebalance completes no sooner than a second after the leave, and a
// KIP-848 leave's partitions are withheld for the group's heartbeat
// interval and then given out once the anchor holds them again. Three
// members consume a 6-partition topic, all behind kproxy on one path and
// all on the brokers on the other, every member heartbeating each second
// on both (the client's interval for classic members; the engine's and
// the cluster's group.consumer.heartbeat.interval.ms for KIP-848 ones);
// c leaves, and the time until a and b own every partition is measured.
// Nothing is owned twice and every record is consumed, on both paths;
// the medians through kproxy stay within what the design costs (1 s for
// a classic leave, the 1 s window, a round trip and 500 ms for a KIP-848
// one) plus a second of slack. KPROXY_PLAIN_LEAVE_ROUNDS sets the rounds
// (3 by default).
func TestPlainLeaveCost(t *testing.T) {
	rounds := envCount("KPROXY_PLAIN_LEAVE_ROUNDS", 3)
	for _, tc := range []struct {
		kind  string
		bound time.Duration // what kproxy may add to the median, slack included
	}{
		{"cooperative", 2 * time.Second},
		{"eager", 2 * time.Second},
		{"kip848", 3 * time.Second},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			s := newStackOn(t, []kfake.Opt{kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "1000"})},
				engineOpt(func(c *groupstate.Config) { c.ConsumerHeartbeatInterval = time.Second }))
			var took [2][]time.Duration // [direct, kproxy]
			for r := range rounds {
				for path, via := range []string{"direct", "kproxy"} {
					took[path] = append(took[path], plainLeave(t, s, tc.kind, via, r))
				}
			}
			direct, through := median(took[0]), median(took[1])
			t.Logf("%s, %d rounds: a and b own every partition %s after c's leave directly (%v), %s through kproxy (%v)",
				tc.kind, rounds, direct, took[0], through, took[1])
			if through > direct+tc.bound {
				t.Errorf("a plain leave through kproxy cost %s, directly %s: more than %s more", through, direct, tc.bound)
			}
		})
	}
}

// plainLeave makes the leave of TestPlainLeaveCost once, the members
// behind kproxy (via "kproxy") or on the brokers ("direct"), and returns
// how long after c's leave a and b owned every partition.
func plainLeave(t *testing.T, s *stack, kind, via string, round int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := fmt.Sprintf("leave-%s-%s-%d", kind, via, round)
	tr := startTrio(ctx, t, s, name, kind, via)

	tr.c.leave()
	tr.mc.own.releaseAll("c")
	left := time.Now()
	waitOwners(t, tr.mc.own, 6, "a", "b")
	took := time.Since(left)
	t.Logf("%s: a and b own every partition %s after c left", name, took.Round(time.Millisecond))
	tr.finish(ctx, t, s)
	return took
}
