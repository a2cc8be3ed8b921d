package kafkastore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/upstream"
)

// Loading a groups partition reads only what was committed (KIP-98
// read_committed): the fetch asks for isolation level 1, so the broker
// returns nothing at or past the partition's last stable offset (LSO) and
// lists the aborted transactions of the range it returns; kgo's
// ProcessFetchPartition with kgo.ReadCommitted() drops the batches of
// those aborted transactions and the control batches (commit and abort
// markers). The scan stops at the LSO seen by its first fetch. The next
// fetch offset is taken from the batch headers (FirstOffset +
// LastOffsetDelta + 1 of the last complete batch), so a range that holds
// only control batches or aborted records still moves the scan forward:
// a partition that ends in a commit marker loads. Non-transactional
// records (local mode) are always stable, so local mode reads exactly
// what it read before.

// scanWithRetries scans partition p for the keys keep accepts, looking
// the leader up again after a leader error.
func (s *Store) scanWithRetries(ctx context.Context, p int32, keep func(key string) bool) (map[string][]byte, error) {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		m, err := s.groupsMeta(ctx)
		if err != nil {
			return nil, err
		}
		if int(p) >= len(m.leaders) {
			return nil, fmt.Errorf("partition %d of %s is gone", p, s.groupsTopic)
		}
		found, code, err := s.scanGroupPartition(ctx, m, p, keep)
		if err != nil {
			s.forgetGroupsMeta()
			return nil, err
		}
		if code == 0 {
			return found, nil
		}
		last = kerr.ErrorForCode(code)
		if !retriableLeaderError(code) {
			return nil, last
		}
		s.forgetGroupsMeta()
		if err := upstream.Sleep(ctx, upstream.Backoff(attempt)); err != nil {
			return nil, fmt.Errorf("%w (last: %v)", err, last)
		}
	}
	return nil, last
}

// scanGroupPartition reads the committed records of partition p from its
// log start to its last stable offset and returns the last value of each
// key keep accepts (absent when the last one is a tombstone). A
// partition-level error is returned as code.
func (s *Store) scanGroupPartition(ctx context.Context, m *groupsTopicMeta, p int32, keep func(key string) bool) (map[string][]byte, int16, error) {
	broker := s.cl.Broker(int(m.leaders[p]))
	var (
		offset int64
		stop   int64 = -1 // the LSO of the first answer
		found        = make(map[string][]byte)
	)
	for {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 1
		req.MaxBytes = maxGroupRecordFetch
		req.IsolationLevel = 1 // read_committed
		req.SessionID, req.SessionEpoch = 0, -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = s.groupsTopic, m.id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = p
		rp.FetchOffset = offset
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = maxGroupRecordFetch
		rp.CurrentLeaderEpoch = -1
		rt.Partitions = []kmsg.FetchRequestTopicPartition{rp}
		req.Topics = []kmsg.FetchRequestTopic{rt}
		raw, err := broker.RetriableRequest(ctx, req)
		if err != nil {
			return nil, 0, err
		}
		resp := raw.(*kmsg.FetchResponse)
		if resp.ErrorCode != 0 {
			return nil, resp.ErrorCode, nil
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return nil, 0, errors.New("malformed fetch response")
		}
		part := &resp.Topics[0].Partitions[0]
		if part.ErrorCode == kerr.OffsetOutOfRange.Code && part.LogStartOffset > offset {
			offset = part.LogStartOffset
			continue
		}
		if part.ErrorCode != 0 {
			return nil, part.ErrorCode, nil
		}
		if stop < 0 {
			stop = part.LastStableOffset
			if stop < 0 || stop > part.HighWatermark {
				// A broker that does not report it (fetch < v4)
				// has no transactions either.
				stop = part.HighWatermark
			}
		}
		if offset >= stop {
			return found, 0, nil
		}
		fp, kgoNext := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset:         offset,
			Topic:          s.groupsTopic,
			Partition:      p,
			IsolationLevel: kgo.ReadCommitted(),
		}, part, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return nil, 0, fp.Err
		}
		for _, r := range fp.Records {
			if r.Offset >= stop {
				break
			}
			if k := string(r.Key); keep(k) {
				if r.Value == nil {
					delete(found, k)
				} else {
					found[k] = r.Value
				}
			}
		}
		next := max(offset, kgoNext, batchesEnd(part.RecordBatches))
		if next == offset {
			// Nothing readable at this offset (a record larger than
			// the fetch allows, or a truncated batch): do not spin.
			return nil, 0, fmt.Errorf("no progress reading %s[%d] at offset %d (last stable offset %d)", s.groupsTopic, p, offset, stop)
		}
		offset = next
	}
}

// batchesEnd returns the offset after the last complete record batch
// (magic 2) at the start of raw, or -1: FirstOffset + LastOffsetDelta + 1
// from the batch header, whatever the batch holds (data, aborted data, a
// control marker).
func batchesEnd(raw []byte) int64 {
	end := int64(-1)
	// FirstOffset int64, Length int32, PartitionLeaderEpoch int32, Magic
	// int8, CRC int32, Attributes int16, LastOffsetDelta int32.
	const header = 8 + 4 + 4 + 1 + 4 + 2 + 4
	for len(raw) >= header {
		first := int64(binary.BigEndian.Uint64(raw))
		length := int64(int32(binary.BigEndian.Uint32(raw[8:])))
		if length < header-12 || int64(len(raw)) < 12+length || raw[16] != 2 {
			break
		}
		delta := int64(int32(binary.BigEndian.Uint32(raw[23:])))
		if delta < 0 {
			break
		}
		end = first + delta + 1
		raw = raw[12+length:]
	}
	return end
}

// GroupsWhere returns the groups whose last committed record in the
// groups topic match accepts, reading every partition of the topic from
// its start (creating the topic if it does not exist, as any first use
// does). It is a start-up question (which share groups did kproxy serve
// here before, internal/shares.Decide), not a load: nothing is kept.
func (s *Store) GroupsWhere(ctx context.Context, match func(record []byte) bool) ([]string, error) {
	m, err := s.groupsMeta(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for p := range int32(len(m.leaders)) {
		found, err := s.scanWithRetries(ctx, p, func(string) bool { return true })
		if err != nil {
			return nil, fmt.Errorf("kafkastore: reading %s[%d]: %w", s.groupsTopic, p, err)
		}
		for group, rec := range found {
			if match(rec) {
				out = append(out, group)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
