package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestShareGroupsServedLag: DescribeShareGroupOffsets v1 (KIP-1226)
// through kproxy answers each share-partition's lag: the records from
// its start to the log's end not yet delivered to completion. A member
// accepts the odd offsets of what it acquired and holds the even ones,
// so the start stays at 0 and the lag is the records produced less the
// ones accepted.
func TestShareGroupsServedLag(t *testing.T) {
	s := newShareStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 30
	topic, group := "lag-share", "lag-share-g"
	if _, err := kadm.NewClient(directClient(t, s)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	s.produceRange(ctx, topic, 0, n)

	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()), kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.ShareMaxRecords(10))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	for len(got) == 0 && ctx.Err() == nil {
		got = cl.PollRecords(ctx, 10).Records()
	}
	accepted, heldZero := 0, false
	for _, r := range got {
		if r.Offset%2 == 1 {
			r.Ack(kgo.AckAccept)
			accepted++
		}
		heldZero = heldZero || r.Offset == 0
	}
	if err := cl.FlushAcks(ctx); err != nil {
		t.Fatalf("flushing acks: %v", err)
	}
	if !heldZero || accepted == 0 {
		t.Fatalf("the first poll got %d records (offset 0 among them: %v), %d accepted", len(got), heldZero, accepted)
	}

	viaKproxy, err := kgo.NewClient(kgo.SeedBrokers(s.kproxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer viaKproxy.Close()
	adm := kadm.NewClient(viaKproxy)
	offs, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil || offs[group].Err != nil {
		t.Fatalf("DescribeShareGroupOffsets: %v %v", err, offs[group].Err)
	}
	o, ok := offs[group].Offsets.Lookup(topic, 0)
	if !ok || o.Err != nil {
		t.Fatalf("no share offset of p0: %+v", offs[group])
	}
	if o.StartOffset != 0 || o.Lag != int64(n-accepted) {
		t.Errorf("p0: start %d, lag %d; want start 0 and lag %d (%d records, %d accepted)", o.StartOffset, o.Lag, n-accepted, n, accepted)
	}
}
