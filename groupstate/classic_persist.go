package groupstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group metadata persistence (a restarted engine resumes each group
// without a rebalance, as Kafka's coordinator does from the group records
// in __consumer_offsets). With a store that implements
// GroupMetadataStore, the engine keeps one record per classic group: its
// protocol type, generation, selected protocol, leader, state timestamp
// and members (ids, client, timeouts, the subscription for the selected
// protocol, the assignment). It is written when a join completes into
// Empty, on the leader's SyncGroup (the syncs are answered only once the
// write is durable), on a static member's replacement in Stable (the
// JoinGroup likewise), and deleted (tombstone) when the group is deleted
// or forgotten after staying Empty. Pending members, parked requests,
// timers and the in-between rebalance states are never written.
//
// The first request for a group id after the engine started (or after
// Engine.Unload dropped it) loads its record before it is served:
// requests wait in the shard's loading list (heartbeats are answered NONE
// at once). A loaded group with members is
// Stable at its stored generation with its stored assignments, and every
// member gets a fresh full session timer: members that keep heartbeating
// go on without a rebalance, those that do not come back expire.
//
// The record is the value of Kafka's own group metadata record
// (kmsg.GroupMetadataValue, schema version 3), so it is versioned and
// readable by Kafka tooling.

// groupRecordVersion is the GroupMetadataValue schema version written.
const groupRecordVersion = 3

// maxKnown bounds the set of group ids known to be loaded; past it the
// set is cleared (those ids are simply loaded again when next seen).
const maxKnown = 100_000

// WithoutGroupMetadata returns store with its GroupMetadataStore side
// hidden (its TopicResolver side kept): an engine over it persists no
// group metadata, as before persistence existed. It is an operator's way
// out when the store cannot keep group metadata (for example no right to
// create the groups topic).
func WithoutGroupMetadata(store OffsetStore) OffsetStore {
	if r, ok := store.(TopicResolver); ok {
		return offsetsAndTopics{store, r}
	}
	return offsetsOnlyStore{store}
}

// offsetsOnlyStore exposes only OffsetStore.
type offsetsOnlyStore struct{ OffsetStore }

// offsetsAndTopics exposes OffsetStore and TopicResolver.
type offsetsAndTopics struct {
	OffsetStore
	TopicResolver
}

// parkedReq is a request waiting for its group's load.
type parkedReq struct {
	run  func()           // serves the request (on the loop)
	fail func(code int16) // answers it with an error (any goroutine)
}

// errEngineClosed is the load result of an operation aborted by Close.
var errEngineClosed = errors.New("groupstate: engine closed")

// loadResult is the outcome of one LoadGroupMetadata.
type loadResult struct {
	record []byte
	found  bool
	err    error
}

// whenLoaded runs run once group id's persisted metadata is loaded (at
// once if it already is, or if the store keeps none). If the load fails,
// fail is called with COORDINATOR_LOAD_IN_PROGRESS and the next request
// tries again.
func (s *shard) whenLoaded(id string, run func(), fail func(int16)) {
	if !s.loadPending(id) {
		run()
		return
	}
	s.loading[id] = append(s.loading[id], parkedReq{run: run, fail: fail})
}

// Load loads the records of groups this engine owns and does not hold
// yet, as the first request for each would, without waiting for one:
// Kafka's coordinator loads every group of a partition it becomes the
// leader of. An owner that claims a partition calls it for the groups
// there that have members, so that what must run for them without a
// request (their anchor at the cluster, docs/anchors.md; their members'
// session timers) starts at once. Groups already held or loading are left
// as they are; a failed load is logged and retried by the next request.
func (e *Engine) Load(groups []string) {
	for _, id := range groups {
		if !e.owns(id) {
			continue
		}
		s := e.shardFor(id)
		s.post(func() {
			if e.owns(id) {
				s.whenLoaded(id, func() {}, func(int16) {})
			}
		})
	}
}

// RecordHasMembers reports whether rec, a group's record as the engine
// writes it, holds members: a classic or KIP-848 group that is not Empty.
// A record it cannot read holds none.
func RecordHasMembers(rec []byte) bool {
	switch {
	case IsShareGroupRecord(rec):
		return false
	case isConsumerRecord(rec):
		var r struct {
			Members []json.RawMessage `json:"members"`
		}
		return json.Unmarshal(rec[2:], &r) == nil && len(r.Members) > 0
	default:
		v, err := decodeGroupRecord(rec)
		return err == nil && len(v.Members) > 0
	}
}

// loadPending reports whether group id still has to be loaded, starting
// its load if none is under way.
func (s *shard) loadPending(id string) bool {
	if s.e.meta == nil || id == "" {
		return false
	}
	if _, ok := s.groups[id]; ok {
		return false
	}
	if _, ok := s.known[id]; ok {
		return false
	}
	if _, ok := s.loading[id]; !ok {
		s.loading[id] = nil
		s.startLoad(id)
	}
	return true
}

// startLoad queues the load of group id.
func (s *shard) startLoad(id string) {
	meta := s.e.meta
	s.enqueueMeta(id, storeOp{
		abort: func(cause error) any { return loadResult{err: cause} },
		run: func(ctx context.Context) (any, func()) {
			rec, found, err := meta.LoadGroupMetadata(ctx, id)
			return loadResult{record: rec, found: found, err: err}, nil
		},
		done: func(res any) { s.finishLoad(id, res.(loadResult)) },
		// Unloaded while loading: the unload answered the parked
		// requests, and what was read may be older than what a later
		// owner wrote. A later request loads again.
		stale: func(any) {},
		// After Close the teardown answered the parked requests.
		closed: func(any) {},
	})
}

// finishLoad installs a loaded group and serves the requests that waited.
func (s *shard) finishLoad(id string, res loadResult) {
	parked := s.loading[id]
	delete(s.loading, id)
	if !s.e.owns(id) {
		// Ownership moved while the group loaded: install nothing.
		for _, p := range parked {
			p.fail(errNotCoordinator)
		}
		return
	}
	if res.err != nil && errors.Is(res.err, ErrGroupLiveOnCluster) {
		// Not ours to serve: the clients go to the cluster's coordinator.
		s.e.log.Debug("groupstate: group live on the cluster, not served here", "group", id)
		for _, p := range parked {
			p.fail(errNotCoordinator)
		}
		return
	}
	if res.err != nil {
		if !errors.Is(res.err, errEngineClosed) && !errors.Is(res.err, errUnloaded) {
			s.e.log.Warn("groupstate: loading group metadata failed", "group", id, "err", res.err)
		}
		for _, p := range parked {
			p.fail(errCoordinatorLoadInProgress)
		}
		return
	}
	if len(s.known) >= maxKnown {
		clear(s.known)
	}
	s.known[id] = struct{}{}
	if res.found && isConsumerRecord(res.record) {
		s.installConsumerRecord(id, res.record)
	} else if res.found && IsShareGroupRecord(res.record) {
		s.installShareRecord(id, res.record)
	} else if res.found {
		if _, exists := s.groups[id]; !exists {
			g, err := s.classicGroupFromRecord(id, res.record)
			switch {
			case err != nil:
				// A record we cannot read is dropped: its members
				// rejoin (one rebalance) rather than the group being
				// stuck.
				s.e.log.Error("groupstate: unreadable group metadata ignored", "group", id, "err", err)
			case g != nil:
				s.groups[id] = g
				g.anchorChanged()
				if s.e.cfg.Events != nil {
					ev := g.event(EventGroupLoaded)
					ev.Members = g.membersList(true)
					s.emit(ev)
				}
				s.e.log.Info("groupstate: group loaded", "group", id, "state", g.state.String(),
					"generation", g.generation, "members", len(g.members))
			}
		}
	}
	for _, p := range parked {
		p.run()
	}
}

// enqueueMeta adds op to the metadata FIFO of group, counting it in
// metaInflight until its completion ran.
func (s *shard) enqueueMeta(group string, op storeOp) {
	e := s.e
	e.metaInflight.Add(1)
	done, closed, stale := op.done, op.closed, op.stale
	op.done = func(res any) {
		defer e.metaInflight.Add(-1)
		done(res)
	}
	if stale != nil {
		op.stale = func(res any) {
			defer e.metaInflight.Add(-1)
			stale(res)
		}
	}
	op.closed = func(res any) {
		defer e.metaInflight.Add(-1)
		if closed != nil {
			closed(res)
		}
	}
	s.push(s.metaOps, group, op)
}

// saveMeta queues a write of group's record. onLoop receives the result
// on the loop; onClosed, if set, is called off the loop instead when the
// engine closed meanwhile.
func (s *shard) saveMeta(group string, record []byte, onLoop func(error), onClosed func()) {
	meta := s.e.meta
	s.enqueueMeta(group, storeOp{
		abort: func(cause error) any { return cause },
		run: func(ctx context.Context) (any, func()) {
			return meta.SaveGroupMetadata(ctx, group, record), nil
		},
		done: func(res any) {
			err, _ := res.(error)
			onLoop(err)
		},
		closed: func(any) {
			if onClosed != nil {
				onClosed()
			}
		},
	})
}

// persist writes g's record in the background: nobody waits for it.
func (g *classicGroup) persist() {
	g.anchorChanged()
	if g.s.e.meta == nil {
		return
	}
	id, gen := g.id, g.generation
	log := g.s.e.log
	g.s.saveMeta(id, g.record(nil), func(err error) {
		if err != nil && !errors.Is(err, errEngineClosed) && !errors.Is(err, errUnloaded) {
			log.Warn("groupstate: persisting group metadata failed", "group", id, "generation", gen, "err", err)
		}
	}, nil)
}

// tombstone deletes the record of group id in the background.
func (s *shard) tombstone(id string) {
	meta := s.e.meta
	if meta == nil {
		return
	}
	log := s.e.log
	s.enqueueMeta(id, storeOp{
		abort: func(cause error) any { return cause },
		run: func(ctx context.Context) (any, func()) {
			return meta.DeleteGroupMetadata(ctx, id), nil
		},
		done: func(res any) {
			if err, _ := res.(error); err != nil && !errors.Is(err, errEngineClosed) && !errors.Is(err, errUnloaded) {
				log.Warn("groupstate: deleting group metadata failed", "group", id, "err", err)
			}
		},
	})
}

// record encodes g. assign, when non-nil, replaces the members'
// assignments (the leader's SyncGroup, before it is applied).
func (g *classicGroup) record(assign map[string][]byte) []byte {
	v := kmsg.NewGroupMetadataValue()
	v.Version = groupRecordVersion
	v.ProtocolType = g.protocolType
	v.Generation = g.generation
	if g.protocol != "" {
		p := g.protocol
		v.Protocol = &p
	}
	if g.leader != "" {
		l := g.leader
		v.Leader = &l
	}
	v.CurrentStateTimestamp = g.s.e.clock.Now().UnixMilli()
	v.Members = make([]kmsg.GroupMetadataValueMember, 0, len(g.order))
	for _, id := range g.order {
		m := g.members[id]
		vm := kmsg.NewGroupMetadataValueMember()
		vm.MemberID = m.id
		if m.instanceID != "" {
			iid := m.instanceID
			vm.InstanceID = &iid
		}
		vm.ClientID, vm.ClientHost = m.clientID, m.clientHost
		vm.RebalanceTimeoutMillis = int32(m.rebalanceTimeout / time.Millisecond)
		vm.SessionTimeoutMillis = int32(m.sessionTimeout / time.Millisecond)
		vm.Subscription = m.metadataFor(g.protocol)
		if vm.Subscription == nil {
			vm.Subscription = []byte{}
		}
		vm.Assignment = m.assignment
		if assign != nil {
			vm.Assignment = assign[id]
		}
		if vm.Assignment == nil {
			vm.Assignment = []byte{}
		}
		v.Members = append(v.Members, vm)
	}
	return v.AppendTo(nil)
}

// decodeGroupRecord reads and checks a record.
func decodeGroupRecord(rec []byte) (*kmsg.GroupMetadataValue, error) {
	if len(rec) < 2 {
		return nil, fmt.Errorf("record of %d bytes is too short", len(rec))
	}
	v := new(kmsg.GroupMetadataValue)
	if err := v.ReadFrom(rec); err != nil {
		return nil, fmt.Errorf("decoding group metadata: %w", err)
	}
	if v.Version < 0 || v.Version > groupRecordVersion {
		return nil, fmt.Errorf("group metadata version %d is not supported (max %d)", v.Version, groupRecordVersion)
	}
	if v.Generation < 0 {
		return nil, fmt.Errorf("negative generation %d", v.Generation)
	}
	if len(v.Members) > 0 && (v.Protocol == nil || *v.Protocol == "" || v.ProtocolType == "") {
		return nil, errors.New("a group with members has no protocol")
	}
	seen := make(map[string]bool, len(v.Members))
	for _, m := range v.Members {
		if m.MemberID == "" || seen[m.MemberID] {
			return nil, fmt.Errorf("member id %q is empty or repeated", m.MemberID)
		}
		seen[m.MemberID] = true
		if m.SessionTimeoutMillis <= 0 {
			return nil, fmt.Errorf("member %q has session timeout %d", m.MemberID, m.SessionTimeoutMillis)
		}
	}
	return v, nil
}

// classicGroupFromRecord rebuilds a classic group from its record: Empty if it has no
// members, else Stable at the stored generation with the stored
// assignments and a fresh session timer for every member. It returns nil
// for a record that holds nothing (generation 0, no members).
func (s *shard) classicGroupFromRecord(id string, rec []byte) (*classicGroup, error) {
	v, err := decodeGroupRecord(rec)
	if err != nil {
		return nil, err
	}
	if v.Generation == 0 && len(v.Members) == 0 {
		return nil, nil
	}
	g := newClassicGroup(s, id)
	g.protocolType = v.ProtocolType
	g.generation = v.Generation
	if v.CurrentStateTimestamp > 0 {
		g.stateSince = time.UnixMilli(v.CurrentStateTimestamp)
	}
	if len(v.Members) == 0 {
		g.armEmptyTimerFor(max(s.e.cfg.EmptyGroupRetention-s.e.clock.Now().Sub(g.stateSince), 0))
		return g, nil
	}
	g.protocol = *v.Protocol
	// Loading is not a transition: the group resumes where it was.
	g.state, g.prevState = stateStable, stateCompletingRebalance
	check := s.e.cfg.CheckCommitOwnership && g.protocolType == "consumer"
	for _, vm := range v.Members {
		m := &classicMember{
			id:             vm.MemberID,
			clientID:       vm.ClientID,
			clientHost:     vm.ClientHost,
			protocols:      []kmsg.JoinGroupRequestProtocol{{Name: g.protocol, Metadata: vm.Subscription}},
			sessionTimeout: time.Duration(vm.SessionTimeoutMillis) * time.Millisecond,
			assignment:     vm.Assignment,
		}
		m.rebalanceTimeout = time.Duration(vm.RebalanceTimeoutMillis) * time.Millisecond
		if m.rebalanceTimeout <= 0 {
			m.rebalanceTimeout = m.sessionTimeout
		}
		if vm.InstanceID != nil {
			m.instanceID = *vm.InstanceID
		}
		if check {
			m.owned = decodeOwned(m.assignment)
		}
		g.add(m, g.protocolType)
	}
	if v.Leader != nil {
		if _, ok := g.members[*v.Leader]; ok {
			g.leader = *v.Leader
		}
	}
	for _, mid := range g.order {
		g.rearmSession(g.members[mid])
	}
	return g, nil
}
