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
// lost.
func TestHandBackFleet(t *testing.T) {
	for _, balancer := range []string{"eager", "cooperative"} {
		t.Run(balancer, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			group, topic := "handback-fleet-"+balancer, "handback-fleet-t-"+balancer
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
			a := startMemberAt(t, relays[0].Addr(), "a", mc())
			b := startMemberAt(t, relays[1].Addr(), "b", mc())
			c := startMemberAt(t, relays[2].Addr(), "c", mc())
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
