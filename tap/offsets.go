package tap

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// PartitionLag is one partition's committed offset, end offset and lag for
// a group.
type PartitionLag struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Committed is the group's committed offset, -1 when none.
	Committed int64 `json:"committed"`
	// End is the partition's high watermark, -1 when unknown.
	End int64 `json:"end"`
	// Lag is End - Committed (End when nothing is committed), -1 when
	// unknown.
	Lag int64 `json:"lag"`
	// Error describes a per-partition failure.
	Error string `json:"error,omitempty"`
}

// LagQuery asks for one group's offsets and lag. Assigned lists the
// partitions the group's members hold: their end offsets and lag are
// reported even where the group has committed nothing yet.
type LagQuery struct {
	Group    string
	Assigned []TopicPartitions
}

// GroupLag is one group's answer from an OffsetSource.
type GroupLag struct {
	// Offsets holds every partition the group committed or is assigned,
	// sorted by topic and partition. Empty (not an error) when the group
	// has neither.
	Offsets []PartitionLag
	// Err says why the group's committed offsets could not be read. A
	// group the offsets' owner has never seen (GROUP_ID_NOT_FOUND) is
	// not an error: it has no commits yet.
	Err error
}

// OffsetSource reports groups' committed offsets and lag for the admin
// API.
type OffsetSource interface {
	// Lag answers every query, keyed by group. An error fails them all
	// (the end offsets could not be listed, for one); a failure of one
	// group is its GroupLag.Err.
	Lag(ctx context.Context, qs []LagQuery) (map[string]GroupLag, error)
}

// totalLag sums the known lags of offsets.
func totalLag(offsets []PartitionLag) int64 {
	var n int64
	for _, l := range offsets {
		if l.Lag > 0 {
			n += l.Lag
		}
	}
	return n
}

// kadmOffsets is an OffsetSource backed by a kadm client.
type kadmOffsets struct {
	adm *kadm.Client // immutable; safe for concurrent use
}

// NewKadmOffsetSource returns an OffsetSource that fetches committed
// offsets with OffsetFetch (every group in one request where the broker
// allows, KIP-709) and end offsets with one ListOffsets through adm.
// Point adm at kproxy itself to read the engine's store, or at the
// upstream brokers when offsets live in their __consumer_offsets.
func NewKadmOffsetSource(adm *kadm.Client) OffsetSource { return kadmOffsets{adm: adm} }

// Lag implements OffsetSource.
func (k kadmOffsets) Lag(ctx context.Context, qs []LagQuery) (map[string]GroupLag, error) {
	out := make(map[string]GroupLag, len(qs))
	if len(qs) == 0 {
		return out, nil
	}
	groups := make([]string, 0, len(qs))
	for _, q := range qs {
		groups = append(groups, q.Group)
	}
	fetched := k.adm.FetchManyOffsets(ctx, groups...)
	committed := make(map[string]kadm.OffsetResponses, len(qs))
	topicSet := map[string]struct{}{}
	for _, q := range qs {
		r, ok := fetched[q.Group]
		switch {
		case !ok:
			out[q.Group] = GroupLag{Err: fmt.Errorf("fetching offsets of group %q: no answer", q.Group)}
			continue
		case errors.Is(r.Err, kerr.GroupIDNotFound):
			// Kafka answers a group with no commits with no offsets;
			// some brokers (kfake) with GROUP_ID_NOT_FOUND.
		case r.Err != nil:
			out[q.Group] = GroupLag{Err: fmt.Errorf("fetching offsets of group %q: %w", q.Group, r.Err)}
			continue
		default:
			committed[q.Group] = r.Fetched
		}
		for t := range committed[q.Group] {
			topicSet[t] = struct{}{}
		}
		for _, tp := range q.Assigned {
			topicSet[tp.Topic] = struct{}{}
		}
	}
	var ends kadm.ListedOffsets
	if len(topicSet) > 0 {
		topics := make([]string, 0, len(topicSet))
		for t := range topicSet {
			topics = append(topics, t)
		}
		sort.Strings(topics)
		var err error
		if ends, err = k.adm.ListEndOffsets(ctx, topics...); err != nil {
			return nil, fmt.Errorf("listing end offsets of %v: %w", topics, err)
		}
	}
	for _, q := range qs {
		if _, failed := out[q.Group]; failed {
			continue
		}
		out[q.Group] = GroupLag{Offsets: computeLag(committed[q.Group], q.Assigned, ends)}
	}
	return out, nil
}

// computeLag joins committed and end offsets into sorted PartitionLags:
// one per committed partition, and one (Committed -1) per assigned
// partition without a commit.
func computeLag(committed kadm.OffsetResponses, assigned []TopicPartitions, ends kadm.ListedOffsets) []PartitionLag {
	out := []PartitionLag{}
	add := func(topic string, partition int32, at int64, fetchErr error) {
		pl := PartitionLag{Topic: topic, Partition: partition, Committed: at, End: -1, Lag: -1}
		if fetchErr != nil {
			pl.Error = fetchErr.Error()
		}
		if e, ok := ends.Lookup(topic, partition); ok {
			switch {
			case e.Err != nil:
				if pl.Error == "" {
					pl.Error = e.Err.Error()
				}
			default:
				pl.End = e.Offset
				switch {
				case pl.Committed < 0:
					pl.Lag = pl.End
				case pl.End >= pl.Committed:
					pl.Lag = pl.End - pl.Committed
				default:
					pl.Lag = 0
				}
			}
		}
		out = append(out, pl)
	}
	committed.Each(func(o kadm.OffsetResponse) { add(o.Topic, o.Partition, o.At, o.Err) })
	type tp struct {
		topic     string
		partition int32
	}
	seen := map[tp]bool{} // a partition two members claim is listed once
	for _, a := range assigned {
		for _, p := range a.Partitions {
			if _, ok := committed.Lookup(a.Topic, p); !ok && !seen[tp{a.Topic, p}] {
				seen[tp{a.Topic, p}] = true
				add(a.Topic, p, -1, nil)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}
