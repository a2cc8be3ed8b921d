package groupstate

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FencedMemoryStore is a MemoryStore shared by several engines, with the
// fencing of docs/fleet.md: every group lives in a partition of the
// groups topic, each partition has a writer epoch (a transactional id's
// producer epoch, KIP-98), claiming a partition bumps it, and a write
// carries the epoch its writer held when the write began: a stale one
// fails with an error wrapping kerr.ProducerFenced and changes nothing.
// Engines reach it through a fencedWriter each.
type FencedMemoryStore struct {
	*MemoryStore
	parts uint32

	mu sync.Mutex // guards every field below; held across each write
	// epochs is the current writer epoch of each partition (0: never
	// claimed).
	epochs []int32
	// writes counts the successful writes of each writer; fenced the
	// writes refused for a stale epoch.
	writes map[string]int
	fenced int
	// last is the last committed offset of each group/topic/partition;
	// backwards records every commit that lowered one.
	last      map[fencedKey]int64
	backwards []string
}

// fencedKey is one committed partition of a group.
type fencedKey struct {
	group, topic string
	partition    int32
}

func newFencedMemoryStore(parts uint32) *FencedMemoryStore {
	return &FencedMemoryStore{
		MemoryStore: NewMemoryStore(),
		parts:       parts,
		epochs:      make([]int32, parts),
		writes:      make(map[string]int),
		last:        make(map[fencedKey]int64),
	}
}

// partition is the groups-topic partition group lives in.
func (fs *FencedMemoryStore) partition(group string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(group))
	return h.Sum32() % fs.parts
}

// writesBy returns the number of successful writes of writer.
func (fs *FencedMemoryStore) writesBy(writer string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.writes[writer]
}

// fencedWrites returns the number of writes refused for a stale epoch.
func (fs *FencedMemoryStore) fencedWrites() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.fenced
}

// committed returns the last committed offset of each partition.
func (fs *FencedMemoryStore) committed() map[fencedKey]int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return maps.Clone(fs.last)
}

// wentBackwards returns the commits that lowered a committed offset.
func (fs *FencedMemoryStore) wentBackwards() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]string(nil), fs.backwards...)
}

// fencedWriter is one engine's access to a FencedMemoryStore: the epochs
// it claimed, the partitions it believes it owns (Config.Owns) and test
// hooks that hold or fail its writes.
type fencedWriter struct {
	*FencedMemoryStore
	name string
	// owned is what Owns answers, per partition (written by the test,
	// read by the engine's loops).
	owned []atomic.Bool

	mu sync.Mutex // guards every field below
	// claimed is the epoch this writer holds per partition (0: none).
	claimed []int32
	// holdSave and holdCommit, when set, hold group metadata writes and
	// offset writes (after their epoch was taken) until closed.
	holdSave, holdCommit chan struct{}
	// failSave fails group metadata writes; holdLoad, when set, holds
	// group metadata loads until closed.
	failSave error
	holdLoad chan struct{}
}

var (
	_ OffsetStore        = (*fencedWriter)(nil)
	_ GroupMetadataStore = (*fencedWriter)(nil)
	_ TopicResolver      = (*fencedWriter)(nil)
	_ TopicMetadataStore = (*fencedWriter)(nil)
)

func (fs *FencedMemoryStore) writer(name string) *fencedWriter {
	return &fencedWriter{FencedMemoryStore: fs, name: name, owned: make([]atomic.Bool, fs.parts), claimed: make([]int32, fs.parts)}
}

// owns is the writer's Config.Owns.
func (w *fencedWriter) owns(group string) bool { return w.owned[w.partition(group)].Load() }

// claim fences the previous writer of p and starts owning it.
func (w *fencedWriter) claim(p uint32) {
	w.FencedMemoryStore.mu.Lock()
	w.epochs[p]++
	epoch := w.epochs[p]
	w.FencedMemoryStore.mu.Unlock()
	w.mu.Lock()
	w.claimed[p] = epoch
	w.mu.Unlock()
	w.owned[p].Store(true)
}

// claimAll claims every partition.
func (w *fencedWriter) claimAll() {
	for p := range w.parts {
		w.claim(p)
	}
}

// setHold installs (or, with nil, removes) the hold of metadata writes
// or offset writes; it returns the previous one.
func (w *fencedWriter) setHold(meta bool, hold chan struct{}) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ptr := &w.holdCommit
	if meta {
		ptr = &w.holdSave
	}
	old := *ptr
	*ptr = hold
	return old
}

// write runs apply under the store's lock if the epoch this writer held
// for group's partition when the write began is still current.
func (w *fencedWriter) write(ctx context.Context, group string, meta bool, apply func() error) error {
	p := w.partition(group)
	w.mu.Lock()
	epoch := w.claimed[p]
	hold, fail := w.holdCommit, error(nil)
	if meta {
		hold, fail = w.holdSave, w.failSave
	}
	w.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.FencedMemoryStore.mu.Lock()
	defer w.FencedMemoryStore.mu.Unlock()
	if epoch == 0 || epoch != w.epochs[p] {
		w.fenced++
		return fmt.Errorf("writer %s with epoch %d of partition %d, now at %d: %w", w.name, epoch, p, w.epochs[p], kerr.ProducerFenced)
	}
	if fail != nil {
		return fail
	}
	if err := apply(); err != nil {
		return err
	}
	w.writes[w.name]++
	return nil
}

// recordCommit checks one committed offset against the last one; the
// store's lock is held.
func (fs *FencedMemoryStore) recordCommit(writer, group, topic string, partition int32, offset int64) {
	k := fencedKey{group, topic, partition}
	if prev, ok := fs.last[k]; ok && offset < prev {
		fs.backwards = append(fs.backwards, fmt.Sprintf("%s: %s/%s/%d went from %d to %d", writer, group, topic, partition, prev, offset))
	}
	fs.last[k] = offset
}

// CommitOffsets implements OffsetStore.
func (w *fencedWriter) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	var out []kmsg.OffsetCommitResponseTopic
	err := w.write(ctx, group, false, func() error {
		var err error
		out, err = w.MemoryStore.CommitOffsets(ctx, group, topics)
		if err == nil {
			for _, t := range topics {
				for _, p := range t.Partitions {
					w.recordCommit(w.name, group, t.Topic, p.Partition, p.Offset)
				}
			}
		}
		return err
	})
	return out, err
}

// TxnCommitOffsets implements OffsetStore.
func (w *fencedWriter) TxnCommitOffsets(ctx context.Context, req *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error) {
	var out *kmsg.TxnOffsetCommitResponse
	err := w.write(ctx, req.Group, false, func() error {
		var err error
		out, err = w.MemoryStore.TxnCommitOffsets(ctx, req)
		return err
	})
	return out, err
}

// DeleteOffsets implements OffsetStore.
func (w *fencedWriter) DeleteOffsets(ctx context.Context, group string, topics []kmsg.OffsetDeleteRequestTopic) ([]kmsg.OffsetDeleteResponseTopic, error) {
	var out []kmsg.OffsetDeleteResponseTopic
	err := w.write(ctx, group, false, func() error {
		var err error
		out, err = w.MemoryStore.DeleteOffsets(ctx, group, topics)
		return err
	})
	return out, err
}

// DeleteGroup implements OffsetStore.
func (w *fencedWriter) DeleteGroup(ctx context.Context, group string) error {
	return w.write(ctx, group, false, func() error { return w.MemoryStore.DeleteGroup(ctx, group) })
}

// SaveGroupMetadata implements GroupMetadataStore.
func (w *fencedWriter) SaveGroupMetadata(ctx context.Context, group string, record []byte) error {
	return w.write(ctx, group, true, func() error { return w.MemoryStore.SaveGroupMetadata(ctx, group, record) })
}

// LoadGroupMetadata implements GroupMetadataStore (reads are not fenced).
func (w *fencedWriter) LoadGroupMetadata(ctx context.Context, group string) ([]byte, bool, error) {
	w.mu.Lock()
	hold := w.holdLoad
	w.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	return w.MemoryStore.LoadGroupMetadata(ctx, group)
}

// DeleteGroupMetadata implements GroupMetadataStore.
func (w *fencedWriter) DeleteGroupMetadata(ctx context.Context, group string) error {
	return w.write(ctx, group, true, func() error { return w.MemoryStore.DeleteGroupMetadata(ctx, group) })
}

// fleetMember is one engine of a test fleet.
type fleetMember struct {
	*harness
	w *fencedWriter
}

// newFleetMember starts an engine named name over fs.
func newFleetMember(t *testing.T, fs *FencedMemoryStore, name string, opts ...harnessConfig) *fleetMember {
	t.Helper()
	w := fs.writer(name)
	h := newHarness(t, append([]harnessConfig{func(c *Config) {
		c.Store = w
		c.Owns = w.owns
	}}, opts...)...)
	h.store = fs.MemoryStore
	return &fleetMember{harness: h, w: w}
}

// release gives partition p up as a revoked owner does: stop owning it,
// then unload its groups.
func (m *fleetMember) release(p uint32) {
	m.w.owned[p].Store(false)
	m.e.Unload(func(g string) bool { return m.w.partition(g) == p })
}

// releaseAll gives every partition up.
func (m *fleetMember) releaseAll() {
	for p := range m.w.parts {
		m.w.owned[p].Store(false)
	}
	m.e.Unload(func(string) bool { return true })
}
