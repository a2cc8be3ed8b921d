package groupconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultStoreTopic is the compacted topic in which kproxy keeps the
// GROUP configs of a cluster that has none. One topic per cluster, not
// per fleet: GROUP configs belong to the cluster, so every kproxy in
// front of it, of any fleet or none, reads and writes the same ones.
//
// Not the groups topic (kafkastore): that topic's records and its
// loaders belong to the engine, which reads every record of it at
// start; configs kept apart load apart, need no change to the engine's
// record schema, and compact on their own key.
const DefaultStoreTopic = "__kproxy_group_configs"

// storeKey is the key of one config's record: one record per group and
// config name, so that compaction keeps each config's last value and
// two kproxies altering different configs of one group do not undo each
// other. Its JSON encoding is deterministic (field order), as compaction
// needs. A record without a value (a tombstone) deletes the config.
type storeKey struct {
	Version int    `json:"v"`
	Group   string `json:"group"`
	Config  string `json:"config"`
}

// Store keeps GROUP configs in DefaultStoreTopic (created with the first
// alter): written with acks=all before an alter is answered (Alter),
// read whole at start (Ready) and followed afterwards, so that every kproxy reading the topic sees an
// alter made through any of them within its fetch latency.
type Store struct {
	cl    *kgo.Client // kproxy's own client of the cluster: writes, topic creation; not owned
	topic string      // immutable
	log   *slog.Logger
	// newConsumer builds the client Run follows the topic with; owned by Run once built.
	newConsumer func(opts ...kgo.Opt) (*kgo.Client, error)

	ready     chan struct{} // closed once the topic was read to its end at start
	readyOnce sync.Once

	// createMu serialises the topic's creation by Alter; created (under
	// createMu) is set once it exists.
	createMu sync.Mutex
	created  bool

	mu     sync.Mutex
	groups map[string]map[string]string // group -> config -> value; guarded by mu
	// applied is the offset of the record each (group, config) holds,
	// so that a write applied on its answer is not undone by an older
	// record read later; guarded by mu.
	applied  map[storeKey]int64
	onChange func(groups []string) // set before Run; called without mu
}

// NewStore returns a Store over topic ("": DefaultStoreTopic); cl
// writes, newConsumer builds the client that follows the topic (both
// reach the same cluster). Run reads it.
func NewStore(cl *kgo.Client, topic string, newConsumer func(opts ...kgo.Opt) (*kgo.Client, error), log *slog.Logger) *Store {
	if topic == "" {
		topic = DefaultStoreTopic
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{cl: cl, topic: topic, log: log, newConsumer: newConsumer, ready: make(chan struct{}),
		groups: map[string]map[string]string{}, applied: map[storeKey]int64{}}
}

// OnChange sets what is told of the groups whose configs changed (an
// alter answered here, or a record of another kproxy read); before Run.
func (s *Store) OnChange(f func(groups []string)) { s.onChange = f }

// Ready is closed once the topic was read to the end it had at start.
func (s *Store) Ready() <-chan struct{} { return s.ready }

// Groups returns the groups the store holds configs of, sorted.
func (s *Store) Groups() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.groups))
	for g := range s.groups {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// Group returns a copy of group's configs (nil when it has none).
func (s *Store) Group(group string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[group]; len(g) > 0 {
		return maps.Clone(g)
	}
	return nil
}

// apply records one config's value (nil: deleted) read at offset;
// false when the store holds a later record of it.
func (s *Store) apply(k storeKey, value *string, offset int64) bool {
	if last, ok := s.applied[k]; ok && last >= offset {
		return false
	}
	s.applied[k] = offset
	g := s.groups[k.Group]
	if value == nil {
		if g == nil {
			return false
		}
		delete(g, k.Config)
		if len(g) == 0 {
			delete(s.groups, k.Group)
		}
		return true
	}
	if g == nil {
		g = map[string]string{}
		s.groups[k.Group] = g
	}
	g[k.Config] = *value
	return true
}

func (s *Store) changed(groups []string) {
	if len(groups) > 0 && s.onChange != nil {
		s.onChange(groups)
	}
}

// Alter writes group's new configs: set's values and a deletion of
// every name in del, acknowledged by all in-sync replicas before it
// returns, and then applied here.
func (s *Store) Alter(ctx context.Context, group string, set map[string]string, del []string) error {
	var recs []*kgo.Record
	for n, v := range set {
		k, _ := json.Marshal(storeKey{Version: 1, Group: group, Config: n})
		recs = append(recs, &kgo.Record{Topic: s.topic, Key: k, Value: []byte(v)})
	}
	for _, n := range del {
		k, _ := json.Marshal(storeKey{Version: 1, Group: group, Config: n})
		recs = append(recs, &kgo.Record{Topic: s.topic, Key: k})
	}
	if len(recs) == 0 {
		return nil
	}
	if err := s.ensureTopic(ctx); err != nil {
		return fmt.Errorf("creating %s: %w", s.topic, err)
	}
	if err := s.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("writing group %q's configs to %s: %w", group, s.topic, err)
	}
	changed := false
	s.mu.Lock()
	for _, r := range recs {
		var k storeKey
		_ = json.Unmarshal(r.Key, &k)
		var v *string
		if r.Value != nil {
			sv := string(r.Value)
			v = &sv
		}
		changed = s.apply(k, v, r.Offset) || changed
	}
	s.mu.Unlock()
	if changed {
		s.changed([]string{group})
	}
	return nil
}

// ensureTopic creates the topic before the first write: a cluster where
// nobody sets GROUP configs through kproxy gets no topic, and one that
// auto-creates topics does not create it uncompacted on a write.
func (s *Store) ensureTopic(ctx context.Context) error {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if s.created {
		return nil
	}
	if err := s.createTopic(ctx); err != nil {
		return err
	}
	s.created = true
	return nil
}

// createTopic creates the compacted topic; an existing one is fine.
func (s *Store) createTopic(ctx context.Context) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = s.topic, 1, -1
	policy := "compact"
	rt.Configs = []kmsg.CreateTopicsRequestTopicConfig{{Name: "cleanup.policy", Value: &policy}}
	req.Topics = []kmsg.CreateTopicsRequestTopic{rt}
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 && t.ErrorCode != kerr.TopicAlreadyExists.Code {
			return kerr.ErrorForCode(t.ErrorCode)
		}
	}
	return nil
}

// endOffset is the topic's (single partition's) end offset.
func (s *Store) endOffset(ctx context.Context) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = s.topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = 0, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return 0, err
	}
	if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
		return 0, errors.New("no partition in the answer")
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return 0, err
	}
	return p.Offset, nil
}

// Run reads the topic to its end (then Ready is closed; a topic that
// does not exist yet is empty) and follows it until ctx ends.
func (s *Store) Run(ctx context.Context) {
	var end int64
	for attempt := 0; ; attempt++ {
		var err error
		end, err = s.endOffset(ctx)
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			end, err = 0, nil
		}
		if err == nil {
			break
		}
		if attempt == 0 {
			s.log.Warn("cannot open the group configs topic yet; retrying", "topic", s.topic, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	cons, err := s.newConsumer(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxWait(time.Second))
	if err != nil {
		s.log.Error("cannot follow the group configs topic: group configs stay as they are", "topic", s.topic, "err", err)
		return
	}
	defer cons.Close()
	if end == 0 {
		s.readyOnce.Do(func() { close(s.ready) })
	}
	for {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			s.log.Warn("reading the group configs topic", "topic", t, "partition", p, "err", err)
		})
		var groups []string
		s.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= end {
				s.readyOnce.Do(func() { close(s.ready) })
			}
			var k storeKey
			if err := json.Unmarshal(r.Key, &k); err != nil || k.Version != 1 || k.Group == "" {
				return // not a record of this version: left alone
			}
			var v *string
			if r.Value != nil {
				sv := string(r.Value)
				v = &sv
			}
			if s.apply(k, v, r.Offset) {
				groups = append(groups, k.Group)
			}
		})
		s.mu.Unlock()
		s.changed(groups)
	}
}
