// Package kafkastore is kproxy's store over the upstream Kafka cluster:
// committed offsets in the cluster's own __consumer_offsets (so lag
// tools see them) and group metadata in a compacted topic (groups.go).
// It implements the store interfaces of package groupstate
// (OffsetStore, TopicResolver, GroupMetadataStore, TopicMetadataStore,
// AnchorStore).
//
// Loads read only committed records (load.go). In local mode writes are
// plain produces and simple commits (generation -1, no member). In
// transactional mode (EnableTransactions, txn.go, for a fleet of
// kproxies, docs/fleet.md) each groups partition is claimed through its
// own transactional id and every write of its groups rides in its
// transactions. With anchors (anchors.go; package internal/coexist holds
// them), the commits of a group with members in the engine go instead
// under its anchor's member id and generation, in every mode.
package kafkastore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/upstream"
)

// Store is the groupstate.OffsetStore over the upstream cluster: offsets are
// ordinary simple commits (generation -1, no member id) in the cluster's
// own __consumer_offsets, so every existing lag tool still sees them. The
// engine has validated membership before; the upstream group coordinator
// only stores. It also keeps group metadata in a compacted topic
// (groupstate.GroupMetadataStore, groups.go). It is safe for concurrent
// use.
type Store struct {
	cl *kgo.Client // immutable
	// up sends the store's requests to coordinators (commits, offset
	// fetches, transactions) on lent clients; immutable, shared with
	// the anchors (Cluster).
	up *upstream.Cluster

	// groupsTopic, groupsPartitions and groupsRF configure the group
	// metadata topic (groups.go); immutable after creation.
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

	// txn is the transactional mode (txn.go), nil in local mode; set
	// once by EnableTransactions before the store is shared.
	txn *txnMode
	// anchors are the groups' anchors (anchors.go), nil when anchoring
	// is off; set once by SetAnchors before the store is shared.
	anchors Anchors
}

var (
	_ groupstate.OffsetStore        = (*Store)(nil)
	_ groupstate.TopicResolver      = (*Store)(nil)
	_ groupstate.TopicMetadataStore = (*Store)(nil)
)

// New returns a store that talks to the cluster behind cl, with
// group metadata in DefaultGroupsTopic.
func New(cl *kgo.Client) *Store {
	return &Store{
		cl:               cl,
		groupsTopic:      DefaultGroupsTopic,
		groupsPartitions: 16,
		groupsRF:         -1,
		log:              slog.Default(),
		ids:              make(map[string][16]byte),
		names:            make(map[[16]byte]string),
		scans:            make(map[int32]*partitionScans),
		up:               upstream.New(cl),
	}
}

// refreshTopics reloads the topic name ↔ id cache from a metadata request
// for every topic.
func (s *Store) refreshTopics(ctx context.Context) error {
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

// TopicNames implements groupstate.TopicResolver.
func (s *Store) TopicNames(ctx context.Context, ids [][16]byte) (map[[16]byte]string, error) {
	return cachedLookup(ctx, s, ids, func() map[[16]byte]string { return s.names })
}

// TopicIDs implements groupstate.TopicResolver.
func (s *Store) TopicIDs(ctx context.Context, names []string) (map[string][16]byte, error) {
	return cachedLookup(ctx, s, names, func() map[string][16]byte { return s.ids })
}

// cachedLookup answers keys from the store's topic cache (the map that
// table returns, read under s.mu), refreshing the cache once from the
// cluster when a key is missing; keys still unknown are left out.
func cachedLookup[K comparable, V any](ctx context.Context, s *Store, keys []K, table func() map[K]V) (map[K]V, error) {
	lookup := func() (map[K]V, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		t := table()
		out := make(map[K]V, len(keys))
		for _, k := range keys {
			if v, ok := t[k]; ok {
				out[k] = v
			}
		}
		return out, len(out) == len(keys)
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
func (s *Store) idsFor(ctx context.Context, names []string) map[string][16]byte {
	ids, err := s.TopicIDs(ctx, names)
	if err != nil {
		return nil
	}
	return ids
}

// nameOf maps a response topic back to its name.
func (s *Store) nameOf(name string, id [16]byte) string {
	if name != "" {
		return name
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[id]
}

// CommitOffsets implements groupstate.OffsetStore with a simple commit
// upstream. In transactional mode the commit rides in the transaction of
// the group's partition (AddOffsetsToTxn + TxnOffsetCommit, generation
// -1, no member) and the call returns once that transaction committed.
//
// With anchors (anchors.go) a group that has members in the engine
// commits as one OffsetCommit under its anchor's identity instead, in
// every mode: the cluster's member and generation checks fence it.
func (s *Store) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	if s.anchors != nil {
		resp, anchored, err := s.anchors.Commit(ctx, group, func() *kmsg.OffsetCommitRequest { return s.commitRequest(ctx, group, topics) })
		if err != nil {
			return nil, err
		}
		if anchored {
			for i := range resp.Topics {
				resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
			}
			return resp.Topics, nil
		}
	}
	if s.txn != nil {
		r := s.txnSubmit(ctx, &txnWrite{group: group, offsets: topics})
		return r.topics, r.err
	}
	req := s.commitRequest(ctx, group, topics)
	resp, err := req.RequestWith(ctx, s.up.Lent())
	if err != nil {
		return nil, fmt.Errorf("kafkastore: offset commit for group %q: %w", group, err)
	}
	for i := range resp.Topics {
		resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
	}
	return resp.Topics, nil
}

// commitRequest builds a simple OffsetCommit (generation -1, no member)
// of topics for group, topics named and identified.
func (s *Store) commitRequest(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) *kmsg.OffsetCommitRequest {
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
	return req
}

// TxnCommitOffsets implements groupstate.OffsetStore by forwarding the request to
// the upstream group coordinator, identity fields cleared; with anchors,
// a group with members in the engine sends it under its anchor's
// identity instead (Anchors.TxnCommit).
func (s *Store) TxnCommitOffsets(ctx context.Context, in *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error) {
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
	if s.anchors != nil {
		resp, anchored, err := s.anchors.TxnCommit(ctx, req)
		if err != nil {
			return nil, err
		}
		if anchored {
			for i := range resp.Topics {
				resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
			}
			return resp, nil
		}
	}
	resp, err := req.RequestWith(ctx, s.up.Lent())
	if err != nil {
		return nil, fmt.Errorf("kafkastore: txn offset commit for group %q: %w", in.Group, err)
	}
	for i := range resp.Topics {
		resp.Topics[i].Topic = s.nameOf(resp.Topics[i].Topic, resp.Topics[i].TopicID)
	}
	return resp, nil
}

// FetchOffsets implements groupstate.OffsetStore with an OffsetFetch
// upstream. In transactional mode it always requires stable offsets and
// retries UNSTABLE_OFFSET_COMMIT briefly.
func (s *Store) FetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, requireStable bool) ([]kmsg.OffsetFetchResponseTopic, error) {
	if s.txn != nil {
		return s.txnFetchOffsets(ctx, group, topics)
	}
	return s.fetchOffsets(ctx, group, topics, requireStable)
}

// fetchOffsets is one OffsetFetch of group upstream.
func (s *Store) fetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, requireStable bool) ([]kmsg.OffsetFetchResponseTopic, error) {
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
	resp, err := req.RequestWith(ctx, s.up.Lent())
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

// DeleteOffsets implements groupstate.OffsetStore with an OffsetDelete upstream.
func (s *Store) DeleteOffsets(ctx context.Context, group string, topics []kmsg.OffsetDeleteRequestTopic) ([]kmsg.OffsetDeleteResponseTopic, error) {
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

// DeleteGroup implements groupstate.OffsetStore with a DeleteGroups upstream.
//
// With anchors it first waits for the group's anchor to have left (the
// engine deletes only empty groups, whose anchor leaves): the cluster
// refuses to delete a group with members.
func (s *Store) DeleteGroup(ctx context.Context, group string) error {
	if s.anchors != nil {
		if err := s.anchors.AwaitGone(ctx, group); err != nil {
			return fmt.Errorf("kafkastore: delete group %q: %w", group, err)
		}
	}
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

// ListGroups implements groupstate.OffsetStore: the simple groups (protocol type "")
// of the upstream cluster, which is how kproxy's commits appear there.
func (s *Store) ListGroups(ctx context.Context) ([]string, error) {
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

// EndOffsets implements groupstate.EndOffsetStore: the high watermark
// of each partition asked for, by a ListOffsets (latest) to its leader.
func (s *Store) EndOffsets(ctx context.Context, topics map[string][]int32) (map[string]map[int32]int64, error) {
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	listed, err := kadm.NewClient(s.cl).ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: end offsets: %w", err)
	}
	out := make(map[string]map[int32]int64, len(topics))
	for t, ps := range topics {
		for _, p := range ps {
			o, ok := listed.Lookup(t, p)
			if !ok || o.Err != nil {
				continue
			}
			if out[t] == nil {
				out[t] = make(map[int32]int64, len(ps))
			}
			out[t][p] = o.Offset
		}
	}
	return out, nil
}

// TopicMetadata implements groupstate.TopicMetadataStore with a metadata request for
// every topic of the cluster; internal topics are left out. It also
// refreshes the store's name ↔ id cache.
func (s *Store) TopicMetadata(ctx context.Context) (map[string]groupstate.TopicInfo, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = nil
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: metadata: %w", err)
	}
	out := make(map[string]groupstate.TopicInfo, len(resp.Topics))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range resp.Topics {
		if t.Topic == nil || t.ErrorCode != 0 || t.IsInternal {
			continue
		}
		out[*t.Topic] = groupstate.TopicInfo{ID: t.TopicID, Partitions: int32(len(t.Partitions))}
		if t.TopicID != ([16]byte{}) {
			s.ids[*t.Topic] = t.TopicID
			s.names[t.TopicID] = *t.Topic
		}
	}
	return out, nil
}
