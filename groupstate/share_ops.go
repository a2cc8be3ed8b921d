package groupstate

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kproxy/kproxy/groupstate/share"
)

// The engine's side of ShareFetch and ShareAcknowledge (KIP-932). The
// share service of the data path serves those requests in three steps,
// as Kafka's broker does between its log and SharePartition:
//
//  1. SharePrepare applies the acknowledgements the request carries and
//     says where each partition's fetch starts (the first offset no
//     member holds), or that a partition has no start yet;
//  2. the service resolves the start of new partitions from the log
//     (share.auto.offset.reset) and hands it to ShareInitialize, fetches
//     from the brokers, and reads the fetched batches' headers;
//  3. ShareAcquire locks offsets of those batches for the member and
//     returns them with their delivery counts.
//
// Each step is one post to the group's loop.

// ShareFetched is what the share service fetched of one partition: the
// offset it fetched from and the headers of the batches it got.
type ShareFetched struct {
	FetchOffset int64
	Batches     []share.Batch
}

// SharePlan is the answer of SharePrepare.
type SharePlan struct {
	// Code is a group-level error (NOT_COORDINATOR while the engine does
	// not own the group, GROUP_ID_NOT_FOUND for a group of another
	// kind); the rest is empty when it is set.
	Code int16
	// AckCodes holds the result of each partition's acknowledgements.
	AckCodes map[ShareTP]int16
	// Offsets holds where each initialized partition's fetch starts.
	Offsets map[ShareTP]int64
	// Uninitialized lists the partitions that have no start offset yet.
	Uninitialized []ShareTP
	// FromLogStart holds the uninitialized partitions of topics the
	// group already reads: partitions added to a topic start at the
	// log's start, as Kafka's coordinator starts them (only a topic new
	// to the group takes share.auto.offset.reset).
	FromLogStart map[ShareTP]bool
	// Settings are the group's settings (isolation level, reset policy,
	// lock duration).
	Settings ShareSettings
}

// shareMetrics counts what the share groups did, for metrics (written on
// the loops, read anywhere).
type shareMetrics struct {
	acquired     atomic.Int64 // records acquired (each delivery)
	acked        [5]atomic.Int64
	lockTimeouts atomic.Int64 // records whose lock timed out
	// archived counts records archived at the delivery limit,
	// redelivered the acquisitions of records delivered before
	// (delivery count above 1).
	archived    atomic.Int64
	redelivered atomic.Int64
	writes      atomic.Int64 // share group records written
	writeNanos  atomic.Int64 // time those writes took
}

// countArchived adds what p archived at the delivery limit since it had
// archived before.
func (m *shareMetrics) countArchived(p *share.Partition, before int64) {
	if n := p.ArchivedAtLimit() - before; n > 0 {
		m.archived.Add(n)
	}
}

// ShareCounters are the engine's share-group counters since its start.
type ShareCounters struct {
	Acquired int64 // deliveries
	// Acknowledged counts records by type: gap, accept, release,
	// reject, renew.
	Acknowledged [5]int64
	LockTimeouts int64
	// ArchivedAtLimit counts the records archived because they had been
	// delivered share.delivery.count.limit times; Redeliveries the
	// acquisitions of records delivered before (delivery count above 1,
	// also counted in Acquired).
	ArchivedAtLimit int64
	Redeliveries    int64
	// Writes counts the share group records written to the store, and
	// WriteTime the time they took.
	Writes    int64
	WriteTime time.Duration
}

// ShareCounters returns the engine's share-group counters.
func (e *Engine) ShareCounters() ShareCounters {
	c := ShareCounters{Acquired: e.shareMetrics.acquired.Load(), LockTimeouts: e.shareMetrics.lockTimeouts.Load(),
		Writes: e.shareMetrics.writes.Load(), WriteTime: time.Duration(e.shareMetrics.writeNanos.Load()),
		ArchivedAtLimit: e.shareMetrics.archived.Load(), Redeliveries: e.shareMetrics.redelivered.Load()}
	for i := range c.Acknowledged {
		c.Acknowledged[i] = e.shareMetrics.acked[i].Load()
	}
	return c
}

// onShareGroup runs fn on the loop of group once it is loaded, with the
// share group held there; a group of another kind, or none, is answered
// code through fail.
func (e *Engine) onShareGroup(id string, fail func(int16), fn func(*shareGroup)) {
	s := e.shardFor(id)
	if !s.post(func() {
		if !e.owns(id) {
			fail(errNotCoordinator)
			return
		}
		s.whenLoaded(id, func() {
			g, ok := s.shareOf(id)
			if !ok {
				fail(errGroupIDNotFound)
				return
			}
			fn(g)
		}, fail)
	}) {
		fail(errCoordinatorNotAvailable)
	}
}

// SharePrepare applies member's acknowledgements (validated by the
// caller with share.ValidateAckBatches) and plans the fetch of the
// partitions in fetch. done runs once, on a loop: it must not block.
func (e *Engine) SharePrepare(group, member string, acks map[ShareTP][]share.AckBatch, fetch []ShareTP, done func(SharePlan)) {
	e.onShareGroup(group, func(code int16) { done(SharePlan{Code: code}) }, func(g *shareGroup) {
		set := g.settings()
		plan := SharePlan{Settings: set, AckCodes: make(map[ShareTP]int16, len(acks)), Offsets: make(map[ShareTP]int64, len(fetch))}
		now, l := e.clock.Now(), set.limits()
		for tp, batches := range acks {
			p := g.parts[tp]
			if p == nil || (set.RenewDisabled && hasRenew(batches)) {
				plan.AckCodes[tp] = errInvalidRecordState
				continue
			}
			before := p.ArchivedAtLimit()
			code := p.Acknowledge(member, batches, now, l)
			e.shareMetrics.countArchived(p, before)
			plan.AckCodes[tp] = code
			if code == errNone {
				g.markDirty()
				for _, b := range batches {
					countAcks(&e.shareMetrics, b)
				}
			}
		}
		for _, tp := range fetch {
			if p := g.parts[tp]; p != nil {
				plan.Offsets[tp] = p.FetchOffset()
			} else {
				plan.Uninitialized = append(plan.Uninitialized, tp)
				if g.readsTopic(tp.TopicID) {
					if plan.FromLogStart == nil {
						plan.FromLogStart = make(map[ShareTP]bool)
					}
					plan.FromLogStart[tp] = true
				}
			}
		}
		g.armLockTimer()
		// Acknowledgements are answered once durable.
		g.persistThen(func(code int16) {
			if code != errNone {
				for tp := range plan.AckCodes {
					if plan.AckCodes[tp] == errNone {
						plan.AckCodes[tp] = code
					}
				}
			}
			done(plan)
		})
	})
}

// hasRenew reports whether a batch renews a lock.
func hasRenew(batches []share.AckBatch) bool {
	for _, b := range batches {
		for _, t := range b.Types {
			if t == share.AckRenew {
				return true
			}
		}
	}
	return false
}

// readsTopic reports whether g has share state for a partition of topic.
func (g *shareGroup) readsTopic(topic [16]byte) bool {
	for tp := range g.parts {
		if tp.TopicID == topic {
			return true
		}
	}
	return false
}

// countAcks adds the records of b to the counters by type.
func countAcks(m *shareMetrics, b share.AckBatch) {
	n := b.Last - b.First + 1
	if len(b.Types) == 1 {
		if t := int(b.Types[0]); t >= 0 && t < len(m.acked) {
			m.acked[t].Add(n)
		}
		return
	}
	for _, t := range b.Types {
		if int(t) >= 0 && int(t) < len(m.acked) {
			m.acked[t].Add(1)
		}
	}
}

// ShareInitialize sets the start offset of partitions that have none
// (a partition another request initialized meanwhile keeps its own).
func (e *Engine) ShareInitialize(group string, starts map[ShareTP]int64, done func(code int16)) {
	e.onShareGroup(group, done, func(g *shareGroup) {
		for tp, off := range starts {
			if g.parts[tp] == nil {
				g.parts[tp] = share.NewPartition(off)
				g.markDirty()
			}
		}
		// A start is durable before records are acquired from it, so
		// "latest" never moves after a restart.
		g.persistThen(done)
	})
}

// ShareAcquire locks offsets of the fetched batches for member: at most
// maxRecords (batch-optimized mode may round up to a batch's end). done
// gets the acquired ranges of each partition.
func (e *Engine) ShareAcquire(group, member string, fetched map[ShareTP]ShareFetched, maxRecords int, mode share.AcquireMode, batchSize int, done func(map[ShareTP][]share.Acquired, int16)) {
	e.onShareGroup(group, func(code int16) { done(nil, code) }, func(g *shareGroup) {
		now, l := e.clock.Now(), g.settings().limits()
		out := make(map[ShareTP][]share.Acquired, len(fetched))
		left := maxRecords
		for tp, f := range fetched {
			p := g.parts[tp]
			if p == nil || len(f.Batches) == 0 || (maxRecords > 0 && left <= 0) {
				continue
			}
			before := p.ArchivedAtLimit()
			got := p.Acquire(member, f.FetchOffset, f.Batches, left, mode, batchSize, now, l)
			e.shareMetrics.countArchived(p, before)
			if len(got) == 0 {
				continue
			}
			out[tp] = got
			g.markDirty()
			var n, again int64
			for _, a := range got {
				n += a.Last - a.First + 1
				if a.DeliveryCount > 1 {
					again += a.Last - a.First + 1
				}
			}
			e.shareMetrics.acquired.Add(n)
			e.shareMetrics.redelivered.Add(again)
			if maxRecords > 0 {
				left -= int(n)
			}
		}
		g.armLockTimer()
		// Acquisitions are durable before the records are handed out,
		// so that delivery counts survive a restart.
		g.persistThen(func(code int16) {
			if code != errNone {
				done(nil, code)
				return
			}
			done(out, errNone)
		})
	})
}

// ShareAdvance moves the start of share-partitions up to their log's
// start, after records were deleted from the log (a fetch answered
// OFFSET_OUT_OF_RANGE): Kafka's SharePartition does the same.
func (e *Engine) ShareAdvance(group string, logStarts map[ShareTP]int64) {
	e.onShareGroup(group, func(int16) {}, func(g *shareGroup) {
		for tp, start := range logStarts {
			if p := g.parts[tp]; p != nil && start > p.StartOffset() {
				p.AdvanceStart(start)
				g.markDirty()
			}
		}
		g.persistThen(nil)
	})
}

// ShareReleaseMember makes the records member holds in partitions of
// group available again: its share session with the broker that leads
// them closed (ShareFetch or ShareAcknowledge at epoch -1, or its
// connection closed).
func (e *Engine) ShareReleaseMember(group, member string, partitions []ShareTP) {
	e.onShareGroup(group, func(int16) {}, func(g *shareGroup) {
		l := g.settings().limits()
		for _, tp := range partitions {
			p := g.parts[tp]
			if p == nil {
				continue
			}
			before := p.ArchivedAtLimit()
			if p.ReleaseMember(member, l) > 0 {
				g.markDirty()
			}
			e.shareMetrics.countArchived(p, before)
		}
		g.persistThen(nil)
	})
}

// ShareStats is one share-partition's state, for the admin API.
type ShareStats struct {
	TP ShareTP
	// Topic is the topic's name in the engine's topic cache, "" when
	// the cache does not know the id (the topic was deleted).
	Topic       string
	StartOffset int64
	share.Stats
}

// ShareStates returns the share-partitions of group; false if the
// engine holds no such share group.
func (e *Engine) ShareStates(group string) ([]ShareStats, bool) {
	type res struct {
		st []ShareStats
		ok bool
	}
	ch := make(chan res, 1)
	s := e.shardFor(group)
	if !s.post(func() {
		g, ok := s.shareOf(group)
		if !ok {
			ch <- res{}
			return
		}
		out := make([]ShareStats, 0, len(g.parts))
		topics := e.topicsNow()
		for tp, p := range g.parts {
			out = append(out, ShareStats{TP: tp, Topic: topics.byID[tp.TopicID], StartOffset: p.StartOffset(), Stats: p.Stats()})
		}
		ch <- res{out, true}
	}) {
		return nil, false
	}
	select {
	case r := <-ch:
		return r.st, r.ok
	case <-time.After(10 * time.Second):
		return nil, false
	}
}

// ShareGroupStat sums the share-partitions of one share group, for
// gauges.
type ShareGroupStat struct {
	Group      string
	Partitions int
	// Acquired counts the records locked for a member (in flight to a
	// consumer); Available those waiting to be delivered (again).
	Acquired, Available int64
}

// ShareGroupStats sums the share-partitions of every share group the
// engine holds, sorted by group. It visits every loop once: for metric
// collection, not for request paths.
func (e *Engine) ShareGroupStats() []ShareGroupStat {
	var (
		mu  sync.Mutex
		all []ShareGroupStat
		wg  sync.WaitGroup
	)
	for _, s := range e.shards {
		wg.Add(1)
		if !s.post(func() {
			defer wg.Done()
			var out []ShareGroupStat
			for _, g := range s.groups {
				sg, ok := g.(*shareGroup)
				if !ok {
					continue
				}
				st := ShareGroupStat{Group: sg.id, Partitions: len(sg.parts)}
				for _, p := range sg.parts {
					ps := p.Stats()
					st.Acquired += ps.Acquired
					st.Available += ps.Available
				}
				out = append(out, st)
			}
			mu.Lock()
			all = append(all, out...)
			mu.Unlock()
		}) {
			wg.Done()
		}
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].Group < all[j].Group })
	return all
}
