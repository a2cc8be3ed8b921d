package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestHandBackFleet: the way back in a fleet. Three members of a group
// kproxy serves sit behind three relays; a fourth kproxy owns the
// group. One member moves back to the brokers: the owner's anchor sees
// it join the cluster's group and hands the group back, and the two
// members still behind kproxy follow it there through their relays,
// which learn of the hand-back from the cluster's group (the anchor and
// a member of the cluster's own in it). One rebalance later the three
// share the partitions in the cluster's group, without the anchor; no
// partition was owned twice, offsets never went backwards, nothing was
// lost. The last run starts the members on the brokers and moves them
// behind the relays first, so the group is taken over (docs/anchors.md)
// seconds before one moves back: the relays stop holding a group taken
// over once the anchor stands alone in the cluster's group.
func TestHandBackFleet(t *testing.T) {
	for _, run := range []struct {
		balancer      string
		takeoverFirst bool
	}{{"eager", false}, {"cooperative", false}, {"cooperative", true}} {
		balancer := run.balancer
		name := balancer
		if run.takeoverFirst {
			name += "-after-takeover"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			group, topic := "handback-fleet-"+name, "handback-fleet-t-"+name
			const n = 600
			cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, topic),
				kfake.GroupMinSessionTimeout(500*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			brokers := cluster.ListenAddrs()
			fc := kproxy.FleetConfig{Name: "handback"}
			startFleetKproxy(t, brokers, fc)
			fc.Relay = true
			relays := []*kproxy.Server{startFleetKproxy(t, brokers, fc), startFleetKproxy(t, brokers, fc), startFleetKproxy(t, brokers, fc)}
			prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			produce := func(from, to int) {
				for i := from; i < to; i++ {
					prod.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, nil)
				}
				if err := prod.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			produce(0, n/2)
			opts := []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}
			if balancer == "eager" {
				opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
			}
			own, recs := newOwnership(t), newRecords()
			watch := watchOffsets(ctx, t, brokers, topic, group)
			mc := func() memberCfg { return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts} }
			names := []string{"a", "b", "c"}
			behind := make([]*member, len(names))
			if run.takeoverFirst {
				// Adoption: the members start on the brokers and move
				// behind the relays one at a time.
				var direct []*member
				for _, name := range names {
					direct = append(direct, startMemberAt(t, brokers[0], name+"-direct", mc()))
				}
				waitOwners(t, own, 6, "a-direct", "b-direct", "c-direct")
				for i, name := range names {
					direct[i].leave()
					own.releaseAll(name + "-direct")
					behind[i] = startMemberAt(t, relays[i].Addr(), name, mc())
					want := append([]string(nil), names[:i+1]...)
					for _, rest := range names[i+1:] {
						want = append(want, rest+"-direct")
					}
					waitOwners(t, own, 6, want...)
				}
			} else {
				for i, name := range names {
					behind[i] = startMemberAt(t, relays[i].Addr(), name, mc())
				}
			}
			a, b, c := behind[0], behind[1], behind[2]
			defer a.leave()
			defer b.leave()
			waitOwners(t, own, 6, "a", "b", "c")
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			adm := kadm.NewClient(cl)
			waitDirectWithin(ctx, t, adm, group, "anchored", 20*time.Second, func(d kadm.DescribedGroup) bool {
				return len(d.Members) == 1 && d.Members[0].InstanceID != nil
			})

			c.leave()
			own.releaseAll("c")
			moved := time.Now()
			c2 := startMemberAt(t, brokers[0], "c-direct", mc())
			defer c2.leave()
			waitOwners(t, own, 6, "a", "b", "c-direct")
			t.Logf("handed back: a, b and c-direct share the partitions %s after c-direct started", time.Since(moved).Round(time.Millisecond))
			d := waitDirectWithin(ctx, t, adm, group, "every member in the cluster's group", 20*time.Second, func(d kadm.DescribedGroup) bool {
				return len(d.Members) == 3 && d.State == "Stable"
			})
			for _, m := range d.Members {
				if m.InstanceID != nil {
					t.Fatalf("the anchor stayed in the cluster's group after the hand-back: %+v", m)
				}
			}
			produce(n/2, n)
			waitConsumed(t, recs, n)
			own.check()
			watch.check(t)
		})
	}
}
