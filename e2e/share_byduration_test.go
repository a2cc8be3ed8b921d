package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestShareGroupsServedByDuration: share.auto.offset.reset=by_duration:PT1H
// set on a group through kproxy starts the group's share-partitions as
// Kafka's SharePartition starts them: at the first record at most an
// hour old, or at the log's end where every record is older. Of records
// written with timestamps two hours ago and now, a share consumer gets
// exactly the recent ones; a partition whose records are all old starts
// at its end, so the consumer gets nothing from it until a record is
// written, then that record. The group's config is kept by kproxy (a
// cluster without GROUP configs, as Kafka 3.x) or by the cluster (4.x
// with share groups off).
func TestShareGroupsServedByDuration(t *testing.T) {
	for _, tc := range []struct {
		name string
		on3x bool
	}{
		{"configs kept by kproxy", true},
		{"configs kept by the cluster", false},
	} {
		t.Run(tc.name, func(t *testing.T) { shareByDuration(t, tc.on3x) })
	}
}

func shareByDuration(t *testing.T, on3x bool) {
	s := newShareServeStack(t, on3x)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// mixed: partition 0 has old records then recent ones, partition 1
	// old ones only, partition 2 recent ones only; old: old ones only.
	const mixed, old, per = "bd-mixed", "bd-old", 5
	direct := directClientWith(t, s, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	adm := kadm.NewClient(direct)
	for topic, partitions := range map[string]int32{mixed: 3, old: 1} {
		if _, err := adm.CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
			t.Fatalf("creating %s: %v", topic, err)
		}
	}
	write := func(topic string, partition int32, value string, ts time.Time) {
		r := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(value), Timestamp: ts}
		if err := direct.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("producing %s to %s/%d: %v", value, topic, partition, err)
		}
	}
	twoHoursAgo := time.Now().Add(-2 * time.Hour)
	for i := range per {
		write(mixed, 0, fmt.Sprintf("old-0-%d", i), twoHoursAgo)
		write(mixed, 1, fmt.Sprintf("old-1-%d", i), twoHoursAgo)
		write(old, 0, fmt.Sprintf("old-%d", i), twoHoursAgo)
	}
	recent := map[string]bool{}
	for i := range per {
		for _, p := range []int32{0, 2} {
			v := fmt.Sprintf("new-%d-%d", p, i)
			write(mixed, p, v, time.Now())
			recent[v] = true
		}
	}

	// The in-memory cluster answers ListOffsets by timestamp as a broker
	// does (the first record at or after it), and kadm lists the log's
	// end where no record is that recent: what kproxy starts from.
	listed, err := adm.ListOffsetsAfterMilli(ctx, time.Now().Add(-time.Hour).UnixMilli(), mixed, old)
	if err != nil {
		t.Fatalf("listing offsets after an hour ago: %v", err)
	}
	for _, w := range []struct {
		topic     string
		partition int32
		offset    int64
	}{{mixed, 0, per}, {mixed, 1, per}, {mixed, 2, 0}, {old, 0, per}} {
		if lo, ok := listed.Lookup(w.topic, w.partition); !ok || lo.Err != nil || lo.Offset != w.offset {
			t.Fatalf("the cluster lists %s/%d after an hour ago at %+v (found %v), want offset %d", w.topic, w.partition, lo, ok, w.offset)
		}
	}

	admin := s.client()
	value := "by_duration:PT1H"
	const group, oldGroup = "bd-g", "bd-old-g"
	for _, g := range []string{group, oldGroup} {
		if msg, err := alterGroupConfig(ctx, t, admin, g, "share.auto.offset.reset", &value); err != nil {
			t.Fatalf("setting share.auto.offset.reset of %s through kproxy: %v (%s)", g, err, msg)
		}
		if v, _, err := describeGroupConfig(ctx, t, admin, g, "share.auto.offset.reset"); err != nil || v != value {
			t.Fatalf("share.auto.offset.reset of %s through kproxy: %q %v, want %s", g, v, err, value)
		}
	}

	// late writes one record to a partition whose records are all old
	// once the group's share-partitions of topic started (partitions of
	// them), after checking that it started at its log's end.
	late := func(g, topic string, partitions int, p int32, v string) func() {
		done := false
		return func() {
			if done {
				return
			}
			states, ok := s.engine.ShareStates(g)
			if !ok || len(states) < partitions {
				return
			}
			for _, st := range states {
				if st.TP.Partition == p && st.StartOffset != per {
					t.Errorf("%s: %s/%d starts at %d, want the log's end %d (every record is two hours old)", g, topic, p, st.StartOffset, per)
				}
			}
			write(topic, p, v, time.Now())
			done = true
		}
	}
	recent["late-1"] = true
	has := func(want map[string]bool) func(map[string]bool) bool {
		return func(got map[string]bool) bool {
			for v := range want {
				if !got[v] {
					return false
				}
			}
			return true
		}
	}
	got := shareRead(t, s.addr(), group, mixed, 9*time.Second, late(group, mixed, 3, 1, "late-1"), has(recent))
	if !maps.Equal(got, recent) {
		t.Errorf("%s on %s got %v, want exactly the records at most an hour old %v", group, mixed, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(recent)))
	}
	got = shareRead(t, s.addr(), oldGroup, old, 9*time.Second, late(oldGroup, old, 1, 0, "late-old"), has(map[string]bool{"late-old": true}))
	if !maps.Equal(got, map[string]bool{"late-old": true}) {
		t.Errorf("%s on %s got %v, want only the record written after it started", oldGroup, old, slices.Sorted(maps.Keys(got)))
	}
}
