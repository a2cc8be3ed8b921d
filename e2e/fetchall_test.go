package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestOffsetFetchAllThroughProxy commits offsets through kproxy and reads
// them back through kproxy with a fetch-all OffsetFetch at every version,
// as lag tools do.
func TestOffsetFetchAllThroughProxy(t *testing.T) {
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic, group = "fetch-all", "fetch-all-group"
	s.produce(ctx, topic, 3, 30)
	adm := kadm.NewClient(s.client())
	offs := kadm.Offsets{}
	for p := range int32(3) {
		offs.AddOffset(topic, p, int64(p+1), -1)
	}
	if _, err := adm.CommitOffsets(ctx, group, offs); err != nil {
		t.Fatalf("commit: %v", err)
	}
	fetched, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("kadm fetch: %v", err)
	}
	for p := range int32(3) {
		if o, ok := fetched.Lookup(topic, p); !ok || o.At != int64(p+1) {
			t.Fatalf("kadm: partition %d: %+v %v (all %v)", p, o, ok, fetched)
		}
	}
	for v := int16(1); v <= kmsg.NewPtrOffsetFetchRequest().MaxVersion(); v++ {
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version = v
		req.Group = group
		rg := kmsg.NewOffsetFetchRequestGroup()
		rg.Group = group
		req.Groups = []kmsg.OffsetFetchRequestGroup{rg}
		if v < 2 { // v0-1 cannot ask for everything
			rt := kmsg.NewOffsetFetchRequestTopic()
			rt.Topic, rt.Partitions = topic, []int32{0, 1, 2}
			req.Topics = []kmsg.OffsetFetchRequestTopic{rt}
		} else {
			req.Topics = nil
		}
		resp, err := req.RequestWith(ctx, s.client())
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		got := map[int32]int64{}
		if v < 8 {
			for _, rt := range resp.Topics {
				for _, p := range rt.Partitions {
					if rt.Topic == topic {
						got[p.Partition] = p.Offset
					}
				}
			}
		} else {
			for _, g := range resp.Groups {
				for _, rt := range g.Topics {
					if rt.Topic != topic && (v < 10 || rt.TopicID == [16]byte{}) {
						t.Fatalf("v%d: topic %q id %x", v, rt.Topic, rt.TopicID)
					}
					for _, p := range rt.Partitions {
						got[p.Partition] = p.Offset
					}
				}
			}
		}
		for p := range int32(3) {
			if got[p] != int64(p+1) {
				t.Fatalf("v%d: partition %d at %d, want %d (all: %v)", v, p, got[p], p+1, got)
			}
		}
	}
}
