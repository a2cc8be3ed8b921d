package tap

import (
	"context"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
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

// OffsetSource reports a group's committed offsets and lag for the admin
// API.
type OffsetSource interface {
	// Lag returns the group's committed offsets and their lag, sorted
	// by topic and partition.
	Lag(ctx context.Context, group string) ([]PartitionLag, error)
}

// kadmOffsets is an OffsetSource backed by a kadm client.
type kadmOffsets struct {
	adm *kadm.Client // immutable; safe for concurrent use
}

// NewKadmOffsetSource returns an OffsetSource that fetches committed
// offsets with OffsetFetch and end offsets with ListOffsets through adm.
// Point adm at kproxy itself to read the engine's store, or at the
// upstream brokers when offsets live in their __consumer_offsets.
func NewKadmOffsetSource(adm *kadm.Client) OffsetSource { return kadmOffsets{adm: adm} }

// Lag implements OffsetSource.
func (k kadmOffsets) Lag(ctx context.Context, group string) ([]PartitionLag, error) {
	committed, err := k.adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("fetching offsets of group %q: %w", group, err)
	}
	topics := make([]string, 0, len(committed))
	for t := range committed {
		topics = append(topics, t)
	}
	if len(topics) == 0 {
		return []PartitionLag{}, nil
	}
	ends, err := k.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %v: %w", topics, err)
	}
	return computeLag(committed, ends), nil
}

// computeLag joins committed and end offsets into sorted PartitionLags.
func computeLag(committed kadm.OffsetResponses, ends kadm.ListedOffsets) []PartitionLag {
	var out []PartitionLag
	committed.Each(func(o kadm.OffsetResponse) {
		pl := PartitionLag{Topic: o.Topic, Partition: o.Partition, Committed: o.At, End: -1, Lag: -1}
		if o.Err != nil {
			pl.Error = o.Err.Error()
		}
		if e, ok := ends.Lookup(o.Topic, o.Partition); ok {
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
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}
