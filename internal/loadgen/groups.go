package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Member is one classic group member. Settle sets ID and Generation.
type Member struct {
	Group      string
	D          Doer // where the member's requests go
	ID         string
	Generation int32
}

// SettleConfig tunes Settle; the zero value is usable.
type SettleConfig struct {
	// Topic is what every member subscribes to; default "bench".
	Topic string
	// SessionTimeout and RebalanceTimeout of the JoinGroups; default 30s
	// and 60s.
	SessionTimeout, RebalanceTimeout time.Duration
	// PollInterval is how often a synced member heartbeats while it waits
	// for the rest of its group (and so how soon it hears of a
	// rebalance); default 50ms.
	PollInterval time.Duration
	// GroupsAtOnce is the size of the waves groups settle in (0: all at
	// once).
	// A broker answers a connection's requests in order, so a JoinGroup
	// parked for its rebalance holds back every answer behind it on its
	// connection, a heartbeat that would tell another member to rejoin
	// included; and the proxy reads at most its in-flight limit of
	// requests per connection ahead. Members that share connections
	// settle in waves small enough that every member's join is read and
	// parked before the first rebalance completes; a wave is settled
	// whole before the next starts.
	GroupsAtOnce int
}

var emptyAssignment = func() []byte {
	a := kmsg.NewConsumerMemberAssignment()
	return a.AppendTo(nil)
}()

// Settle drives every member into its group until each group has one
// generation in which all its members joined and synced (the group is
// Stable and every member holds its assignment); it sets each member's ID
// and Generation. A member whose sync or heartbeat reports a rebalance
// joins again. ctx bounds the whole.
func Settle(ctx context.Context, members []*Member, cfg SettleConfig) error {
	if cfg.Topic == "" {
		cfg.Topic = "bench"
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Second
	}
	if cfg.RebalanceTimeout <= 0 {
		cfg.RebalanceTimeout = 60 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	// Each group's tally: generation -> members synced in it.
	type tally struct {
		mu     sync.Mutex
		size   int
		synced map[int32]int // guarded by mu
	}
	groups := map[string]*tally{}
	for _, m := range members {
		t := groups[m.Group]
		if t == nil {
			t = &tally{synced: map[int32]int{}}
			groups[m.Group] = t
		}
		t.size++
	}
	allSynced := func(t *tally, gen int32) bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.synced[gen] == t.size
	}
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{cfg.Topic}
	protocols := []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	// The first failure stops every member; it is the one returned.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	settleOne := func(m *Member) {
		t := groups[m.Group]
		err := settleMember(ctx, m, protocols, cfg, func(gen int32) {
			t.mu.Lock()
			t.synced[gen]++
			t.mu.Unlock()
		}, func(gen int32) bool { return allSynced(t, gen) })
		if err != nil {
			errOnce.Do(func() { first = err; cancel() })
		}
	}
	byGroup := map[string][]*Member{}
	var order []string
	for _, m := range members {
		if byGroup[m.Group] == nil {
			order = append(order, m.Group)
		}
		byGroup[m.Group] = append(byGroup[m.Group], m)
	}
	// Waves of GroupsAtOnce groups, each settled whole before the next
	// starts: no new parked join lands in front of a heartbeat that a
	// rebalancing group of the wave waits for.
	wave := len(order)
	if cfg.GroupsAtOnce > 0 {
		wave = cfg.GroupsAtOnce
	}
	for len(order) > 0 && ctx.Err() == nil {
		n := min(wave, len(order))
		for _, g := range order[:n] {
			for _, m := range byGroup[g] {
				wg.Go(func() { settleOne(m) })
			}
		}
		order = order[n:]
		wg.Wait()
	}
	if first == nil && ctx.Err() != nil {
		first = fmt.Errorf("settling: %w", ctx.Err())
	}
	if first != nil {
		return first
	}
	for _, m := range members {
		if !allSynced(groups[m.Group], m.Generation) {
			return fmt.Errorf("group %s: members ended in different generations", m.Group)
		}
	}
	return nil
}

// settleMember joins, syncs and heartbeats one member until its whole
// group synced in the member's generation.
func settleMember(ctx context.Context, m *Member, protocols []kmsg.JoinGroupRequestProtocol, cfg SettleConfig, synced func(int32), all func(int32) bool) error {
	member := ""
	for {
		join := kmsg.NewPtrJoinGroupRequest()
		join.Group, join.MemberID, join.ProtocolType, join.Protocols = m.Group, member, "consumer", protocols
		join.SessionTimeoutMillis = int32(cfg.SessionTimeout.Milliseconds())
		join.RebalanceTimeoutMillis = int32(cfg.RebalanceTimeout.Milliseconds())
		resp, err := Request(ctx, m.D, join)
		if err != nil {
			return fmt.Errorf("group %s: join: %w", m.Group, err)
		}
		jr := resp.(*kmsg.JoinGroupResponse)
		member = jr.MemberID
		if jr.ErrorCode != 0 {
			if !retriable(jr.ErrorCode) {
				return fmt.Errorf("group %s: join: %w", m.Group, kerr.ErrorForCode(jr.ErrorCode))
			}
			continue // MEMBER_ID_REQUIRED, or a rebalance under way
		}
		sync := kmsg.NewPtrSyncGroupRequest()
		sync.Group, sync.MemberID, sync.Generation = m.Group, member, jr.Generation
		sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("range")
		if jr.LeaderID == member {
			for _, jm := range jr.Members {
				sync.GroupAssignment = append(sync.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: jm.MemberID, MemberAssignment: emptyAssignment})
			}
		}
		resp, err = Request(ctx, m.D, sync)
		if err != nil {
			return fmt.Errorf("group %s: sync: %w", m.Group, err)
		}
		if code := resp.(*kmsg.SyncGroupResponse).ErrorCode; code != 0 {
			if !retriable(code) {
				return fmt.Errorf("group %s: sync: %w", m.Group, kerr.ErrorForCode(code))
			}
			continue
		}
		synced(jr.Generation)
		m.ID, m.Generation = member, jr.Generation
		rejoin := false
		for !all(jr.Generation) {
			if err := sleepCtx(ctx, cfg.PollInterval); err != nil {
				return fmt.Errorf("group %s: waiting for the group to sync: %w", m.Group, err)
			}
			hb := kmsg.NewPtrHeartbeatRequest()
			hb.Group, hb.MemberID, hb.Generation = m.Group, member, jr.Generation
			resp, err := Request(ctx, m.D, hb)
			if err != nil {
				return fmt.Errorf("group %s: heartbeat: %w", m.Group, err)
			}
			if code := resp.(*kmsg.HeartbeatResponse).ErrorCode; code != 0 {
				if !retriable(code) {
					return fmt.Errorf("group %s: heartbeat: %w", m.Group, kerr.ErrorForCode(code))
				}
				rejoin = true
				break
			}
		}
		if !rejoin {
			return nil
		}
	}
}

// retriable says whether a member answered code joins again.
func retriable(code int16) bool {
	switch code {
	case kerr.MemberIDRequired.Code, kerr.RebalanceInProgress.Code, kerr.IllegalGeneration.Code,
		kerr.UnknownMemberID.Code, kerr.CoordinatorLoadInProgress.Code, kerr.CoordinatorNotAvailable.Code,
		kerr.NotCoordinator.Code:
		return true
	}
	return false
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HeartbeatLoad keeps one heartbeat in flight per member: each answer
// sends the member's next heartbeat from its callback. Its counters are
// safe for concurrent use.
type HeartbeatLoad struct {
	answered atomic.Int64 // heartbeats answered NONE
	failed   atomic.Int64 // heartbeats answered with an error or not at all
	stopping atomic.Bool
	inflight sync.WaitGroup // one per member still sending
	firstErr atomic.Pointer[error]
}

// StartHeartbeats starts the load over members, settled by Settle.
func StartHeartbeats(members []*Member) *HeartbeatLoad {
	l := &HeartbeatLoad{}
	l.inflight.Add(len(members))
	for _, m := range members {
		l.next(m)
	}
	return l
}

func (l *HeartbeatLoad) next(m *Member) {
	if l.stopping.Load() {
		l.inflight.Done()
		return
	}
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = m.Group, m.ID, m.Generation
	m.D.Do(hb, func(resp kmsg.Response, err error) {
		if err == nil {
			if code := resp.(*kmsg.HeartbeatResponse).ErrorCode; code != 0 {
				err = fmt.Errorf("group %s member %s: heartbeat: %w", m.Group, m.ID, kerr.ErrorForCode(code))
			}
		}
		if err != nil {
			l.failed.Add(1)
			l.firstErr.CompareAndSwap(nil, &err)
			l.inflight.Done() // a failed member stops
			return
		}
		l.answered.Add(1)
		l.next(m)
	})
}

// Answered is the number of heartbeats answered NONE so far.
func (l *HeartbeatLoad) Answered() int64 { return l.answered.Load() }

// Failed is the number of heartbeats that failed so far; a member stops
// at its first failure.
func (l *HeartbeatLoad) Failed() int64 { return l.failed.Load() }

// Stop sends no more heartbeats and waits up to timeout for those in
// flight; it returns the first failure, if any.
func (l *HeartbeatLoad) Stop(timeout time.Duration) error {
	l.stopping.Store(true)
	done := make(chan struct{})
	go func() { l.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		return fmt.Errorf("heartbeats still in flight %v after stopping", timeout)
	}
	if e := l.firstErr.Load(); e != nil {
		return *e
	}
	return nil
}
