package kafkastore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/upstream"
)

// Store keeps group metadata in a compacted topic of the upstream
// cluster (DefaultGroupsTopic unless configured): one record per group,
// key = group id, value = the engine's record, null value = tombstone.
// The record of a group lives in partition hash(group id) mod partitions,
// with the hash of Kafka's default key partitioner (murmur2), so any
// Kafka tool producing a keyed record reaches the same partition. A load
// reads the group's partition from its start to the high watermark and
// keeps the last value of the key: nothing is cached but the topic's
// partition leaders, which are looked up again on any error.
//
// The topic is created on first use with cleanup.policy=compact. Its
// partition count must never change afterwards (records would no longer
// be found where their key hashes); a topic created by an operator with
// any partition count is used as it is.

// DefaultGroupsTopic is the compacted topic holding group metadata.
const DefaultGroupsTopic = "__kproxy_groups"

// Options configures NewWith; zero values are
// defaults.
type Options struct {
	// GroupsTopic is the group metadata topic; "" means
	// DefaultGroupsTopic.
	GroupsTopic string
	// GroupsPartitions is the partition count used when kproxy creates
	// the topic; 0 means 16.
	GroupsPartitions int32
	// GroupsReplicationFactor is the replication factor used when kproxy
	// creates the topic; 0 means the broker default.
	GroupsReplicationFactor int16
	// Logger receives the store's warnings; nil means slog.Default().
	Logger *slog.Logger
}

// groupsTopicMeta is what a Store knows of its groups topic.
type groupsTopicMeta struct {
	id      [16]byte
	leaders []int32 // per partition; -1 = unknown
}

// maxGroupRecordFetch bounds one fetch of a groups partition.
const maxGroupRecordFetch = 16 << 20

// groupRecordMaxBytes is the max.message.bytes of a groups topic kproxy
// creates.
const groupRecordMaxBytes = 8 << 20

var _ groupstate.GroupMetadataStore = (*Store)(nil)

// NewWith is New with options.
func NewWith(cl *kgo.Client, opts Options) *Store {
	s := New(cl)
	if opts.GroupsTopic != "" {
		s.groupsTopic = opts.GroupsTopic
	}
	if opts.GroupsPartitions > 0 {
		s.groupsPartitions = opts.GroupsPartitions
	}
	if opts.GroupsReplicationFactor > 0 {
		s.groupsRF = opts.GroupsReplicationFactor
	}
	if opts.Logger != nil {
		s.log = opts.Logger
	}
	return s
}

// GroupsTopic returns the name of the group metadata topic.
func (s *Store) GroupsTopic() string { return s.groupsTopic }

// groupsMeta returns the groups topic's metadata, creating the topic if
// it does not exist yet and waiting until every partition has a leader.
func (s *Store) groupsMeta(ctx context.Context) (*groupsTopicMeta, error) {
	s.mu.Lock()
	cached := s.gmeta
	s.mu.Unlock()
	if cached != nil {
		return cached, nil
	}
	created := false
	for attempt := 0; ; attempt++ {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		topic := s.groupsTopic
		rt.Topic = &topic
		req.Topics = []kmsg.MetadataRequestTopic{rt}
		req.AllowAutoTopicCreation = false
		resp, err := req.RequestWith(ctx, s.cl)
		if err != nil {
			return nil, fmt.Errorf("kafkastore: metadata of %s: %w", s.groupsTopic, err)
		}
		var retry error
		switch {
		case len(resp.Topics) != 1:
			return nil, fmt.Errorf("kafkastore: metadata of %s: %d topics in the response", s.groupsTopic, len(resp.Topics))
		case resp.Topics[0].ErrorCode == kerr.UnknownTopicOrPartition.Code && !created:
			if err := s.createGroupsTopic(ctx, len(resp.Brokers)); err != nil {
				return nil, err
			}
			created = true
			retry = kerr.UnknownTopicOrPartition
		case resp.Topics[0].ErrorCode != 0:
			retry = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
		default:
			t := resp.Topics[0]
			m := &groupsTopicMeta{id: t.TopicID, leaders: make([]int32, len(t.Partitions))}
			for i := range m.leaders {
				m.leaders[i] = -1
			}
			for _, p := range t.Partitions {
				if p.Partition < 0 || int(p.Partition) >= len(m.leaders) {
					return nil, fmt.Errorf("kafkastore: metadata of %s: partition %d out of range", s.groupsTopic, p.Partition)
				}
				if p.ErrorCode == 0 && p.Leader >= 0 {
					m.leaders[p.Partition] = p.Leader
				}
			}
			if len(m.leaders) == 0 {
				retry = errors.New("no partitions yet")
				break
			}
			for i, l := range m.leaders {
				if l < 0 {
					retry = fmt.Errorf("partition %d has no leader", i)
				}
			}
			if retry == nil {
				s.mu.Lock()
				first := !s.gchecked
				s.gmeta, s.gchecked = m, true
				s.mu.Unlock()
				if first {
					s.checkCompacted(ctx)
				}
				return m, nil
			}
		}
		// A new topic takes a moment to show everywhere.
		if attempt >= 50 {
			return nil, fmt.Errorf("kafkastore: metadata of %s: %w", s.groupsTopic, retry)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kafkastore: metadata of %s: %w (last: %v)", s.groupsTopic, ctx.Err(), retry)
		case <-time.After(time.Duration(10*(attempt+1)) * time.Millisecond):
		}
	}
}

// checkCompacted warns, once, if the groups topic is not compacted: its
// records would then be deleted by retention and idle groups forgotten.
func (s *Store) checkCompacted(ctx context.Context) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = s.groupsTopic
	res.ConfigNames = []string{"cleanup.policy"}
	req.Resources = []kmsg.DescribeConfigsRequestResource{res}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		s.log.Warn("kafkastore: cannot check the cleanup policy of the groups topic", "topic", s.groupsTopic, "err", err)
		return
	}
	for _, r := range resp.Resources {
		if r.ErrorCode != 0 {
			s.log.Warn("kafkastore: cannot check the cleanup policy of the groups topic", "topic", s.groupsTopic, "err", kerr.ErrorForCode(r.ErrorCode))
			return
		}
		for _, c := range r.Configs {
			if c.Name == "cleanup.policy" && (c.Value == nil || !strings.Contains(*c.Value, "compact")) {
				v := "<null>"
				if c.Value != nil {
					v = *c.Value
				}
				s.log.Error("kafkastore: the groups topic is not compacted: retention will delete the metadata of idle groups; set cleanup.policy=compact",
					"topic", s.groupsTopic, "cleanup.policy", v)
			}
		}
	}
}

// createGroupsTopic creates the compacted groups topic; an existing one
// is fine. A broker older than 2.4 refuses the default replication factor
// (-1): it is then asked for min(3, brokers).
func (s *Store) createGroupsTopic(ctx context.Context, brokers int) error {
	err := s.createGroupsTopicRF(ctx, s.groupsRF)
	if errors.Is(err, kerr.InvalidReplicationFactor) && s.groupsRF == -1 && brokers > 0 {
		err = s.createGroupsTopicRF(ctx, int16(min(3, brokers)))
	}
	return err
}

// createGroupsTopicRF creates the groups topic with replication factor rf.
func (s *Store) createGroupsTopicRF(ctx context.Context, rf int16) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = s.groupsTopic
	rt.NumPartitions = s.groupsPartitions
	rt.ReplicationFactor = rf
	// Large groups make large records: allow 8 MiB (the broker default
	// is 1 MiB).
	policy, maxBytes := "compact", strconv.Itoa(groupRecordMaxBytes)
	rt.Configs = []kmsg.CreateTopicsRequestTopicConfig{
		{Name: "cleanup.policy", Value: &policy},
		{Name: "max.message.bytes", Value: &maxBytes},
	}
	req.Topics = []kmsg.CreateTopicsRequestTopic{rt}
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("kafkastore: creating %s: %w", s.groupsTopic, err)
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 && t.ErrorCode != kerr.TopicAlreadyExists.Code {
			return fmt.Errorf("kafkastore: creating %s: %w", s.groupsTopic, kerr.ErrorForCode(t.ErrorCode))
		}
	}
	return nil
}

// forgetGroupsMeta drops the cached leaders after an error.
func (s *Store) forgetGroupsMeta() {
	s.mu.Lock()
	s.gmeta = nil
	s.mu.Unlock()
}

// GroupPartition is the partition of a groups topic with partitions
// partitions that holds group's record: murmur2(group) mod partitions,
// Kafka's default key partitioner (kgo's StickyKeyPartitioner with a key,
// the Java client's BuiltInPartitioner). The fleet owns groups by this
// partition (docs/fleet.md). partitions must be positive.
func GroupPartition(group string, partitions int) int32 {
	if partitions <= 0 {
		return 0
	}
	return int32(groupKeyPartitioner.Partition(&kgo.Record{Key: []byte(group)}, partitions))
}

// groupKeyPartitioner is shared by every GroupPartition call and never
// written after init: ForTopic allocates a math/rand source (about 5 KB)
// for records without a key, and GroupPartition runs on every group
// request; a record with a key only reads the hash function, so
// concurrent calls are safe.
var groupKeyPartitioner = kgo.StickyKeyPartitioner(nil).ForTopic("")

// retriableLeaderError reports whether code means the leader moved or is
// not there yet: the metadata is looked up again and the call retried.
func retriableLeaderError(code int16) bool {
	switch code {
	case kerr.NotLeaderForPartition.Code, kerr.LeaderNotAvailable.Code, kerr.UnknownTopicOrPartition.Code,
		kerr.FencedLeaderEpoch.Code, kerr.UnknownLeaderEpoch.Code, kerr.UnknownTopicID.Code, kerr.NotEnoughReplicas.Code:
		return true
	}
	return false
}

// SaveGroupMetadata implements groupstate.GroupMetadataStore: it produces the record
// with acks=all and returns once the partition leader acknowledged it. In
// transactional mode the record rides in the transaction of the group's
// partition, and the call returns once that transaction committed.
func (s *Store) SaveGroupMetadata(ctx context.Context, group string, record []byte) error {
	if record == nil {
		record = []byte{}
	}
	if s.txn != nil {
		return s.txnSubmit(ctx, &txnWrite{group: group, meta: true, value: append([]byte{}, record...)}).err
	}
	return s.produceGroupRecord(ctx, group, record)
}

// DeleteGroupMetadata implements groupstate.GroupMetadataStore with a tombstone.
func (s *Store) DeleteGroupMetadata(ctx context.Context, group string) error {
	if s.txn != nil {
		return s.txnSubmit(ctx, &txnWrite{group: group, meta: true}).err
	}
	return s.produceGroupRecord(ctx, group, nil)
}

// produceGroupRecord writes key group with value (nil = tombstone).
func (s *Store) produceGroupRecord(ctx context.Context, group string, value []byte) error {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		m, err := s.groupsMeta(ctx)
		if err != nil {
			return err
		}
		p := GroupPartition(group, len(m.leaders))
		req := kmsg.NewPtrProduceRequest()
		req.Acks = -1
		req.TimeoutMillis = 15000
		if dl, ok := ctx.Deadline(); ok {
			req.TimeoutMillis = int32(max(min(time.Until(dl), 15*time.Second), time.Millisecond) / time.Millisecond)
		}
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = s.groupsTopic, m.id
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = p
		rp.Records = singleRecordBatch([]byte(group), value, time.Now().UnixMilli())
		rt.Partitions = []kmsg.ProduceRequestTopicPartition{rp}
		req.Topics = []kmsg.ProduceRequestTopic{rt}
		raw, err := s.cl.Broker(int(m.leaders[p])).RetriableRequest(ctx, req)
		if err != nil {
			s.forgetGroupsMeta()
			return fmt.Errorf("kafkastore: writing the metadata of group %q: %w", group, err)
		}
		resp := raw.(*kmsg.ProduceResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return fmt.Errorf("kafkastore: writing the metadata of group %q: malformed produce response", group)
		}
		code := resp.Topics[0].Partitions[0].ErrorCode
		if code == 0 {
			return nil
		}
		last = kerr.ErrorForCode(code)
		if !retriableLeaderError(code) {
			return fmt.Errorf("kafkastore: writing the metadata of group %q: %w", group, last)
		}
		s.forgetGroupsMeta()
		if err := upstream.Sleep(ctx, time.Duration(20*(attempt+1))*time.Millisecond); err != nil {
			return fmt.Errorf("kafkastore: writing the metadata of group %q: %w (last: %v)", group, err, last)
		}
	}
	return fmt.Errorf("kafkastore: writing the metadata of group %q: %w", group, last)
}

// LoadGroupMetadata implements groupstate.GroupMetadataStore: it reads the group's
// partition's committed records up to the last stable offset (load.go)
// and returns the last value written for the group's key. In
// transactional mode it answers from the index of the group's claimed
// partition. Loads of groups in one partition that arrive while
// a scan of it runs are served together by the next scan (after a
// restart every group loads at once), and each caller's scan starts after
// its call.
func (s *Store) LoadGroupMetadata(ctx context.Context, group string) ([]byte, bool, error) {
	if s.anchors != nil {
		rec, err := s.anchors.CheckLoad(ctx, group)
		if err != nil {
			return nil, false, err
		}
		if rec != nil {
			// Taken over from the cluster's coordinator
			// (internal/coexist/anchor_takeover.go):
			// written as the group's record, so that the next owner
			// after a failover resumes it too.
			if err := s.SaveGroupMetadata(ctx, group, rec); err != nil {
				s.log.Warn("kafkastore: the record of a group taken over was not written; a failover before its next rebalance makes its members rejoin",
					"group", group, "err", err)
			}
			return rec, true, nil
		}
	}
	if s.txn != nil {
		return s.txnLoad(ctx, group)
	}
	m, err := s.groupsMeta(ctx)
	if err != nil {
		return nil, false, err
	}
	p := GroupPartition(group, len(m.leaders))
	ch := make(chan scanResult, 1)
	s.mu.Lock()
	ps := s.scans[p]
	if ps == nil {
		ps = &partitionScans{waiting: make(map[string][]chan scanResult)}
		s.scans[p] = ps
	}
	ps.waiting[group] = append(ps.waiting[group], ch)
	start := !ps.running
	ps.running = true
	s.mu.Unlock()
	if start {
		go s.runScans(p, ps)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, false, fmt.Errorf("kafkastore: loading the metadata of group %q: %w", group, r.err)
		}
		return r.value, r.found, nil
	case <-ctx.Done():
		return nil, false, fmt.Errorf("kafkastore: loading the metadata of group %q: %w", group, ctx.Err())
	}
}

// partitionScans is the load queue of one groups partition (guarded by
// Store.mu).
type partitionScans struct {
	running bool
	waiting map[string][]chan scanResult // group → callers waiting for the next scan
}

// scanResult is one group's answer from a scan.
type scanResult struct {
	value []byte
	found bool
	err   error
}

// groupScanTimeout bounds one scan of a groups partition.
const groupScanTimeout = 30 * time.Second

// runScans scans partition p for the waiting groups until nobody waits.
func (s *Store) runScans(p int32, ps *partitionScans) {
	for {
		s.mu.Lock()
		waiting := ps.waiting
		if len(waiting) == 0 {
			ps.running = false
			s.mu.Unlock()
			return
		}
		ps.waiting = make(map[string][]chan scanResult)
		s.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), groupScanTimeout)
		found, err := s.scanWithRetries(ctx, p, func(key string) bool { _, ok := waiting[key]; return ok })
		cancel()
		for group, chans := range waiting {
			r := scanResult{err: err}
			if err == nil {
				r.value, r.found = found[group], found[group] != nil
			}
			for _, ch := range chans {
				ch <- r
			}
		}
	}
}

// singleRecordBatch encodes one uncompressed, non-transactional record
// (magic 2) with key and value (nil = null).
func singleRecordBatch(key, value []byte, ts int64) []byte {
	return recordBatch([]kmsg.Record{{Key: key, Value: value}}, ts, -1, -1, -1, false)
}

// recordBatch encodes recs (keys and values set, the rest filled in
// here) as one uncompressed record batch (magic 2) of producer pid at
// epoch whose first record has sequence number seq (-1, -1, -1 for a
// plain producer), with the transactional attribute if txn.
func recordBatch(recs []kmsg.Record, ts int64, pid int64, epoch int16, seq int32, txn bool) []byte {
	var records []byte
	for i := range recs {
		r := &recs[i]
		r.Attributes, r.TimestampDelta64, r.OffsetDelta = 0, 0, int32(i)
		r.Length = 0
		// Length counts what follows the length varint; with Length 0
		// that varint takes one byte.
		r.Length = int32(len(r.AppendTo(nil)) - 1)
		records = r.AppendTo(records)
	}
	b := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1,
		Magic:                2,
		LastOffsetDelta:      int32(len(recs) - 1),
		FirstTimestamp:       ts,
		MaxTimestamp:         ts,
		ProducerID:           pid,
		ProducerEpoch:        epoch,
		FirstSequence:        seq,
		NumRecords:           int32(len(recs)),
		Records:              records,
	}
	if txn {
		b.Attributes = 0x0010 // transactional
	}
	buf := b.AppendTo(nil)
	// Length covers everything after itself (FirstOffset 8 + Length 4);
	// the CRC-32C covers everything after the CRC (at bytes 17-20).
	binary.BigEndian.PutUint32(buf[8:12], uint32(len(buf)-12))
	binary.BigEndian.PutUint32(buf[17:21], crc32.Checksum(buf[21:], crc32c))
	return buf
}

// crc32c is the Castagnoli table record batches are checked with.
var crc32c = crc32.MakeTable(crc32.Castagnoli)
