package groupstate

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaStore is the OffsetStore over the upstream cluster: offsets are
// ordinary simple commits (generation -1, no member id) in the cluster's
// own __consumer_offsets, so every existing lag tool still sees them. The
// engine has validated membership before; the upstream group coordinator
// only stores. It also keeps group metadata in a compacted topic
// (GroupMetadataStore, kafkastore_groups.go). It is safe for concurrent
// use.
type KafkaStore struct {
	cl *kgo.Client // immutable

	// groupsTopic, groupsPartitions and groupsRF configure the group
	// metadata topic (kafkastore_groups.go); immutable after creation.
	groupsTopic      string
	groupsPartitions int32
	groupsRF         int16
	log              *slog.Logger

	mu       sync.Mutex // guards ids, names, gmeta (caches of the cluster's metadata) and scans
	ids      map[string][16]byte
	names    map[[16]byte]string
	gmeta    *groupsTopicMeta // nil until looked up, and after an error
	gchecked bool             // the topic's cleanup policy was checked
	// scans holds the load queue of each groups partition.
	scans map[int32]*partitionScans
}

var (
	_ OffsetStore   = (*KafkaStore)(nil)
	_ TopicResolver = (*KafkaStore)(nil)
)

// NewKafkaStore returns a store that talks to the cluster behind cl, with
// group metadata in DefaultGroupsTopic.
func NewKafkaStore(cl *kgo.Client) *KafkaStore {
	return &KafkaStore{
		cl:               cl,
		groupsTopic:      DefaultGroupsTopic,
		groupsPartitions: 16,
		groupsRF:         -1,
		log:              slog.Default(),
		ids:              make(map[string][16]byte),
		names:            make(map[[16]byte]string),
		scans:            make(map[int32]*partitionScans),
	}
}

// refreshTopics reloads the topic name ↔ id cache from a metadata request
// for every topic.
func (s *KafkaStore) refreshTopics(ctx context.Context) error {
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = nil
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("kafkastore: metadata: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range resp.Topics {
		if t.Topic == nil || t.TopicID == ([16]byte{}) {
			continue
		}
		s.ids[*t.Topic] = t.TopicID
		s.names[t.TopicID] = *t.Topic
	}
	return nil
}

// TopicNames implements TopicResolver.
func (s *KafkaStore) TopicNames(ctx context.Context, ids [][16]byte) (map[[16]byte]string, error) {
	lookup := func() (map[[16]byte]string, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		out := make(map[[16]byte]string, len(ids))
		for _, id := range ids {
			if n, ok := s.names[id]; ok {
				out[id] = n
			}
		}
		return out, len(out) == len(ids)
	}
	if out, all := lookup(); all {
		return out, nil
	}
	if err := s.refreshTopics(ctx); err != nil {
		return nil, err
	}
	out, _ := lookup()
	return out, nil
}

// TopicIDs implements TopicResolver.
func (s *KafkaStore) TopicIDs(ctx context.Context, names []string) (map[string][16]byte, error) {
	lookup := func() (map[string][16]byte, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		out := make(map[string][16]byte, len(names))
		for _, n := range names {
			if id, ok := s.ids[n]; ok {
				out[n] = id
			}
		}
		return out, len(out) == len(names)
	}
	if out, all := lookup(); all {
		return out, nil
	}
	if err := s.refreshTopics(ctx); err != nil {
		return nil, err
	}
	out, _ := lookup()
	return out, nil
}

// idsFor returns ids for names, best effort: the broker may pick a request
// version that names topics by id, so both are filled in.
func (s *KafkaStore) idsFor(ctx context.Context, names []string) map[string][16]byte {
	ids, err := s.TopicIDs(ctx, names)
	if err != nil {
		return nil
	}
	return ids
}

// nameOf maps a response topic back to its name.
func (s *KafkaStore) nameOf(name string, id [16]byte) string {
	if name != "" {
		return name
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[id]
}

// CommitOffsets implements OffsetStore with a simple commit upstream.
func (s *KafkaStore) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	names := make([]string, len(topics))
	for i, t := range topics {
		names[i] = t.Topic
	}
	ids := s.idsFor(ctx, names)
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = group
	req.Generation = -1
	req.MemberID = ""
	for _, t := range topics {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = t.Topic, ids[t.Topic]
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.Partition, p.Offset, p.LeaderEpoch, p.Metadata
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: offset commit for group %q: %w", group, err)
	}
	for i := range resp.Topics {
		resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
	}
	return resp.Topics, nil
}

// TxnCommitOffsets implements OffsetStore by forwarding the request to
// the upstream group coordinator, identity fields cleared.
func (s *KafkaStore) TxnCommitOffsets(ctx context.Context, in *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error) {
	names := make([]string, len(in.Topics))
	for i, t := range in.Topics {
		names[i] = t.Topic
	}
	ids := s.idsFor(ctx, names)
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID = in.TransactionalID
	req.Group = in.Group
	req.ProducerID, req.ProducerEpoch = in.ProducerID, in.ProducerEpoch
	req.Generation, req.MemberID, req.InstanceID = -1, "", nil
	for _, t := range in.Topics {
		req.Topics = append(req.Topics, kmsg.TxnOffsetCommitRequestTopic{Topic: t.Topic, TopicID: ids[t.Topic], Partitions: t.Partitions})
	}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: txn offset commit for group %q: %w", in.Group, err)
	}
	for i := range resp.Topics {
		resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
	}
	return resp, nil
}

// FetchOffsets implements OffsetStore with an OffsetFetch upstream.
func (s *KafkaStore) FetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, requireStable bool) ([]kmsg.OffsetFetchResponseTopic, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	req.RequireStable = requireStable
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = group
	if topics != nil {
		names := make([]string, len(topics))
		for i, t := range topics {
			names[i] = t.Topic
		}
		ids := s.idsFor(ctx, names)
		req.Topics = make([]kmsg.OffsetFetchRequestTopic, 0, len(topics))
		rg.Topics = make([]kmsg.OffsetFetchRequestGroupTopic, 0, len(topics))
		for _, t := range topics {
			req.Topics = append(req.Topics, kmsg.OffsetFetchRequestTopic{Topic: t.Topic, Partitions: t.Partitions})
			rg.Topics = append(rg.Topics, kmsg.OffsetFetchRequestGroupTopic{Topic: t.Topic, TopicID: ids[t.Topic], Partitions: t.Partitions})
		}
	}
	req.Groups = []kmsg.OffsetFetchRequestGroup{rg}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: offset fetch for group %q: %w", group, err)
	}
	if len(resp.Groups) > 0 {
		g := resp.Groups[0]
		if g.ErrorCode == kerr.GroupIDNotFound.Code {
			// Some brokers (kfake) answer this for a group with no
			// offsets; Kafka answers "no offset". Both mean the same.
			return noOffsets(topics), nil
		}
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, fmt.Errorf("kafkastore: offset fetch for group %q: %w", group, err)
		}
		var missing [][16]byte
		for _, t := range g.Topics {
			if t.Topic == "" {
				missing = append(missing, t.TopicID)
			}
		}
		if len(missing) > 0 {
			_, _ = s.TopicNames(ctx, missing)
		}
		out := make([]kmsg.OffsetFetchResponseTopic, 0, len(g.Topics))
		for _, t := range g.Topics {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = s.nameOf(t.Topic, t.TopicID)
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata, rp.ErrorCode = p.Partition, p.Offset, p.LeaderEpoch, p.Metadata, p.ErrorCode
				rt.Partitions = append(rt.Partitions, rp)
			}
			out = append(out, rt)
		}
		return out, nil
	}
	if resp.ErrorCode == kerr.GroupIDNotFound.Code {
		return noOffsets(topics), nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("kafkastore: offset fetch for group %q: %w", group, err)
	}
	return resp.Topics, nil
}

// noOffsets answers an offset fetch for a group that has none: offset -1
// for every requested partition, nothing when all were asked for.
func noOffsets(topics []kmsg.OffsetFetchRequestTopic) []kmsg.OffsetFetchResponseTopic {
	out := make([]kmsg.OffsetFetchResponseTopic, 0, len(topics))
	for _, t := range topics {
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetFetchResponseTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, -1, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		out = append(out, rt)
	}
	return out
}

// DeleteOffsets implements OffsetStore with an OffsetDelete upstream.
func (s *KafkaStore) DeleteOffsets(ctx context.Context, group string, topics []kmsg.OffsetDeleteRequestTopic) ([]kmsg.OffsetDeleteResponseTopic, error) {
	req := kmsg.NewPtrOffsetDeleteRequest()
	req.Group = group
	req.Topics = topics
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: offset delete for group %q: %w", group, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("kafkastore: offset delete for group %q: %w", group, err)
	}
	return resp.Topics, nil
}

// DeleteGroup implements OffsetStore with a DeleteGroups upstream.
func (s *KafkaStore) DeleteGroup(ctx context.Context, group string) error {
	req := kmsg.NewPtrDeleteGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("kafkastore: delete group %q: %w", group, err)
	}
	for _, g := range resp.Groups {
		if g.Group == group {
			if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
				return fmt.Errorf("kafkastore: delete group %q: %w", group, err)
			}
			return nil
		}
	}
	return fmt.Errorf("kafkastore: delete group %q: group missing from the response", group)
}

// ListGroups implements OffsetStore: the simple groups (protocol type "")
// of the upstream cluster, which is how kproxy's commits appear there.
func (s *KafkaStore) ListGroups(ctx context.Context) ([]string, error) {
	req := kmsg.NewPtrListGroupsRequest()
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: list groups: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("kafkastore: list groups: %w", err)
	}
	var out []string
	for _, g := range resp.Groups {
		if g.ProtocolType == "" {
			out = append(out, g.Group)
		}
	}
	return out, nil
}
