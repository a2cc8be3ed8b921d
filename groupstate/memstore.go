package groupstate

import (
	"context"
	"crypto/sha256"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// MemoryStore is an OffsetStore and GroupMetadataStore in memory, for
// tests and experiments.
// Transactional offsets are applied at once (there is no transaction
// coordinator behind it). It is safe for concurrent use.
type MemoryStore struct {
	mu sync.Mutex // guards every field below
	// groups maps group → topic → partition → committed offset.
	groups map[string]map[string]map[int32]memOffset
	ids    map[string][16]byte
	names  map[[16]byte]string
	// meta maps group → its group metadata record.
	meta map[string][]byte
	// parts maps topic → partition count, for TopicMetadata (SetTopic).
	parts map[string]int32
}

// memOffset is one committed offset.
type memOffset struct {
	offset   int64
	epoch    int32
	metadata string
}

var (
	_ OffsetStore        = (*MemoryStore)(nil)
	_ TopicResolver      = (*MemoryStore)(nil)
	_ GroupMetadataStore = (*MemoryStore)(nil)
	_ TopicMetadataStore = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		groups: make(map[string]map[string]map[int32]memOffset),
		ids:    make(map[string][16]byte),
		names:  make(map[[16]byte]string),
		meta:   make(map[string][]byte),
	}
}

// SaveGroupMetadata implements GroupMetadataStore.
func (s *MemoryStore) SaveGroupMetadata(_ context.Context, group string, record []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.meta[group] = append([]byte(nil), record...)
	return nil
}

// DeleteGroupMetadata implements GroupMetadataStore.
func (s *MemoryStore) DeleteGroupMetadata(_ context.Context, group string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.meta, group)
	return nil
}

// LoadGroupMetadata implements GroupMetadataStore.
func (s *MemoryStore) LoadGroupMetadata(_ context.Context, group string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.meta[group]
	if !ok {
		return nil, false, nil
	}
	return append([]byte(nil), rec...), true, nil
}

// SetTopicID registers the ID of a topic, for requests that name topics
// by ID.
func (s *MemoryStore) SetTopicID(name string, id [16]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[name] = id
	s.names[id] = name
}

// TopicNames implements TopicResolver.
func (s *MemoryStore) TopicNames(_ context.Context, ids [][16]byte) (map[[16]byte]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[[16]byte]string, len(ids))
	for _, id := range ids {
		if n, ok := s.names[id]; ok {
			out[id] = n
		}
	}
	return out, nil
}

// TopicIDs implements TopicResolver.
func (s *MemoryStore) TopicIDs(_ context.Context, names []string) (map[string][16]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][16]byte, len(names))
	for _, n := range names {
		if id, ok := s.ids[n]; ok {
			out[n] = id
		}
	}
	return out, nil
}

// put stores one offset; s.mu must be held.
func (s *MemoryStore) put(group, topic string, partition int32, o memOffset) {
	g := s.groups[group]
	if g == nil {
		g = make(map[string]map[int32]memOffset)
		s.groups[group] = g
	}
	t := g[topic]
	if t == nil {
		t = make(map[int32]memOffset)
		g[topic] = t
	}
	t[partition] = o
}

// CommitOffsets implements OffsetStore.
func (s *MemoryStore) CommitOffsets(_ context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]kmsg.OffsetCommitResponseTopic, 0, len(topics))
	for _, t := range topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			o := memOffset{offset: p.Offset, epoch: p.LeaderEpoch}
			if p.Metadata != nil {
				o.metadata = *p.Metadata
			}
			s.put(group, t.Topic, p.Partition, o)
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, rp)
		}
		out = append(out, rt)
	}
	return out, nil
}

// TxnCommitOffsets implements OffsetStore; the offsets apply at once.
func (s *MemoryStore) TxnCommitOffsets(_ context.Context, req *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := kmsg.NewPtrTxnOffsetCommitResponse()
	for _, t := range req.Topics {
		rt := kmsg.NewTxnOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			o := memOffset{offset: p.Offset, epoch: p.LeaderEpoch}
			if p.Metadata != nil {
				o.metadata = *p.Metadata
			}
			s.put(req.Group, t.Topic, p.Partition, o)
			rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, nil
}

// FetchOffsets implements OffsetStore.
func (s *MemoryStore) FetchOffsets(_ context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, _ bool) ([]kmsg.OffsetFetchResponseTopic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[group]
	entry := func(p int32, o memOffset, ok bool) kmsg.OffsetFetchResponseTopicPartition {
		rp := kmsg.NewOffsetFetchResponseTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = p, -1, -1
		md := ""
		if ok {
			rp.Offset, rp.LeaderEpoch, md = o.offset, o.epoch, o.metadata
		}
		rp.Metadata = &md
		return rp
	}
	var out []kmsg.OffsetFetchResponseTopic
	if topics == nil {
		names := make([]string, 0, len(g))
		for t := range g {
			names = append(names, t)
		}
		sort.Strings(names)
		for _, t := range names {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t
			ps := make([]int32, 0, len(g[t]))
			for p := range g[t] {
				ps = append(ps, p)
			}
			sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
			for _, p := range ps {
				rt.Partitions = append(rt.Partitions, entry(p, g[t][p], true))
			}
			out = append(out, rt)
		}
		return out, nil
	}
	for _, t := range topics {
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			o, ok := g[t.Topic][p]
			rt.Partitions = append(rt.Partitions, entry(p, o, ok))
		}
		out = append(out, rt)
	}
	return out, nil
}

// DeleteOffsets implements OffsetStore.
func (s *MemoryStore) DeleteOffsets(_ context.Context, group string, topics []kmsg.OffsetDeleteRequestTopic) ([]kmsg.OffsetDeleteResponseTopic, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[group]
	if !ok {
		return nil, kerr.GroupIDNotFound
	}
	var out []kmsg.OffsetDeleteResponseTopic
	for _, t := range topics {
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			delete(g[t.Topic], p.Partition)
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, rp)
		}
		if len(g[t.Topic]) == 0 {
			delete(g, t.Topic)
		}
		out = append(out, rt)
	}
	return out, nil
}

// DeleteGroup implements OffsetStore.
func (s *MemoryStore) DeleteGroup(_ context.Context, group string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[group]; !ok {
		return kerr.GroupIDNotFound
	}
	delete(s.groups, group)
	return nil
}

// ListGroups implements OffsetStore.
func (s *MemoryStore) ListGroups(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.groups))
	for g := range s.groups {
		out = append(out, g)
	}
	sort.Strings(out)
	return out, nil
}

// SetTopic creates or resizes a topic for TopicMetadata. A topic without
// an ID registered with SetTopicID gets one derived from its name.
func (s *MemoryStore) SetTopic(name string, partitions int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[name]
	if !ok {
		sum := sha256.Sum256([]byte("kproxy-topic/" + name))
		copy(id[:], sum[:16])
		s.ids[name] = id
		s.names[id] = name
	}
	if s.parts == nil {
		s.parts = make(map[string]int32)
	}
	s.parts[name] = partitions
}

// DeleteTopic removes a topic created with SetTopic.
func (s *MemoryStore) DeleteTopic(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parts, name)
}

// TopicMetadata implements TopicMetadataStore: the topics given to
// SetTopic.
func (s *MemoryStore) TopicMetadata(context.Context) (map[string]TopicInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]TopicInfo, len(s.parts))
	for n, p := range s.parts {
		out[n] = TopicInfo{ID: s.ids[n], Partitions: p}
	}
	return out, nil
}
