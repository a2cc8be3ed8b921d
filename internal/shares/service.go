// Package shares is kproxy's share service: it serves ShareFetch and
// ShareAcknowledge (KIP-932) for the share groups kproxy's engine serves
// in front of a cluster that lacks them.
//
// It does what Kafka's broker does between its log and a share-partition
// (Kafka's SharePartitionManager): it keeps each member's share session
// (epochs, the partitions it fetches), applies acknowledgements through
// the engine, fetches records from the partition's leader, reads only
// the headers of the fetched batches, and asks the engine which offsets
// the member acquires (groupstate/share_ops.go). The records go back to
// the client as the broker sent them; only the acquired ranges are
// added. The engine never sees record bytes, and the service holds no
// share state of its own beyond the sessions.
package shares

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
	"github.com/kproxy/kproxy/proxy"
)

// Config configures a Service.
type Config struct {
	// Engine serves the share groups' state; required. A
	// *groupstate.Engine, or in a fleet Routed over it (fleet.go).
	Engine Ops
	// NewClient makes a client of the cluster for fetches; required.
	// Each fetch holds a client of its own (a broker answers one
	// connection's requests in order, so fetches waiting MaxWaitMs on
	// one connection would wait for each other); up to Clients are
	// kept.
	NewClient func() (*kgo.Client, error)
	// Clients bounds the fetch clients kept idle; 0 means 16.
	Clients int
	// MaxSessions bounds the share sessions (group.share.max.share.sessions);
	// 0 means 2000.
	MaxSessions int
	// ConfigsRead, when set, returns a channel closed once group's
	// GROUP configs were first read (nil if they were, or no read is
	// coming): a share-partition's start (share.auto.offset.reset) waits
	// for it, at most half a second.
	ConfigsRead func(group string) <-chan struct{}
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
}

// Service serves ShareFetch and ShareAcknowledge. It is safe for
// concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger

	// mu guards sessions, byConn and conns: the share sessions, per
	// connection the (group, member) sessions it opened, and per
	// connection the queue its requests are served from.
	// A member has a share session with each broker it fetches from
	// (Kafka's ShareSessionCache is per broker): sessions are kept per
	// listener node.
	mu       sync.Mutex
	sessions map[int32]*share.Sessions
	byConn   map[uint64]map[memberKey]struct{}
	conns    map[uint64]chan func()

	// pool holds idle fetch clients; admin is the client that lists
	// offsets and topics (short requests, shared).
	pool  chan *kgo.Client
	admin *kgo.Client

	// topicMu guards names, the cluster's topics by id as last listed
	// (ListOffsets takes names; a partition of a topic not listed is
	// refused as a broker does), and namesAt, when. A listing replaces
	// the map, which is never changed after, so a caller may read it
	// without the lock.
	topicMu sync.Mutex
	names   map[[16]byte]topicInfo
	namesAt time.Time

	// badReset is the last share.auto.offset.reset that did not parse,
	// logged once until another does (resetOffsets, on any goroutine).
	badReset atomic.Pointer[string]

	ctx    context.Context
	cancel context.CancelFunc
}

// topicInfo is a topic as the cluster's metadata lists it.
type topicInfo struct {
	name       string
	partitions int32
}

type memberKey struct {
	group, member string
	node          int32
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Engine == nil || cfg.NewClient == nil {
		return nil, fmt.Errorf("shares: Config.Engine and Config.NewClient are required")
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 16
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 2000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	admin, err := cfg.NewClient()
	if err != nil {
		return nil, fmt.Errorf("shares: admin client: %w", err)
	}
	s := &Service{
		cfg: cfg, log: cfg.Logger,
		sessions: make(map[int32]*share.Sessions),
		byConn:   make(map[uint64]map[memberKey]struct{}),
		conns:    make(map[uint64]chan func()),
		pool:     make(chan *kgo.Client, cfg.Clients),
		admin:    admin,
		names:    make(map[[16]byte]topicInfo),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Close stops the service and closes its clients.
func (s *Service) Close() {
	s.cancel()
	s.admin.Close()
	for {
		select {
		case cl := <-s.pool:
			cl.Close()
		default:
			return
		}
	}
}

// lend returns a fetch client, from the pool or new.
func (s *Service) lend() (*kgo.Client, error) {
	select {
	case cl := <-s.pool:
		return cl, nil
	default:
		return s.cfg.NewClient()
	}
}

// giveBack returns a fetch client to the pool, or closes it when the
// pool is full.
func (s *Service) giveBack(cl *kgo.Client) {
	select {
	case s.pool <- cl:
	default:
		cl.Close()
	}
}

var _ proxy.ShareService = (*Service)(nil)

// serve runs fn after the share requests conn sent before: a broker
// serves one request of a connection at a time, so a client's share
// session epochs and acknowledgements apply in the order it sent them.
// Requests of different connections run at once.
func (s *Service) serve(conn uint64, fn func()) {
	s.mu.Lock()
	q := s.conns[conn]
	if q == nil {
		q = make(chan func(), 16)
		s.conns[conn] = q
		go func() {
			for fn := range q {
				fn()
			}
		}()
	}
	s.mu.Unlock()
	q <- fn
}

// Closed ends the share sessions conn opened and releases their records.
// The proxy calls it once the connection's answers were all written, so
// none of its requests is still being served.
func (s *Service) Closed(conn uint64) {
	s.mu.Lock()
	if q := s.conns[conn]; q != nil {
		close(q)
		delete(s.conns, conn)
	}
	keys := s.byConn[conn]
	delete(s.byConn, conn)
	var closed []*share.Session
	for k := range keys {
		if sess := s.sessionsOf(k.node).Remove(k.group, k.member); sess != nil {
			closed = append(closed, sess)
		}
	}
	s.mu.Unlock()
	for _, sess := range closed {
		s.cfg.Engine.ShareReleaseMember(sess.Group, sess.Member, sess.Partitions())
	}
}

// sessionsOf returns the share sessions of node's listener; s.mu is held.
func (s *Service) sessionsOf(node int32) *share.Sessions {
	c := s.sessions[node]
	if c == nil {
		c = share.NewSessions(s.cfg.MaxSessions)
		s.sessions[node] = c
	}
	return c
}

// session applies a request's session epoch (Kafka's ShareSessionCache
// rules) and returns the partitions the session fetches.
func (s *Service) session(c proxy.ShareConn, group, member string, epoch int32, add, forget []share.TopicPartition) ([]share.TopicPartition, int16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, code := s.sessionsOf(c.Node).Update(group, member, epoch, add, forget)
	k := memberKey{group, member, c.Node}
	if epoch == -1 {
		for _, keys := range s.byConn {
			delete(keys, k)
		}
		if sess == nil {
			return nil, code
		}
		return sess.Partitions(), code
	}
	if code != 0 {
		return nil, code
	}
	keys := s.byConn[c.Conn]
	if keys == nil {
		keys = make(map[memberKey]struct{})
		s.byConn[c.Conn] = keys
	}
	keys[k] = struct{}{}
	return sess.Partitions(), 0
}

// ShareFetch serves one ShareFetch: acknowledgements, then a fetch.
func (s *Service) ShareFetch(c proxy.ShareConn, req *kmsg.ShareFetchRequest, reply func(kmsg.Response)) {
	s.serve(c.Conn, func() { s.shareFetch(c, req, reply) })
}

// ShareAcknowledge serves one ShareAcknowledge.
func (s *Service) ShareAcknowledge(c proxy.ShareConn, req *kmsg.ShareAcknowledgeRequest, reply func(kmsg.Response)) {
	s.serve(c.Conn, func() { s.shareAcknowledge(c, req, reply) })
}

func (s *Service) shareFetch(c proxy.ShareConn, req *kmsg.ShareFetchRequest, reply func(kmsg.Response)) {
	arrived := time.Now()
	resp := kmsg.NewPtrShareFetchResponse()
	resp.Version = req.Version
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	group, member := deref(req.GroupID), deref(req.MemberID)
	if group == "" || member == "" {
		fail(kerr.InvalidRequest.Code, "GroupId and MemberId are required")
		return
	}
	acks := make(map[groupstate.ShareTP][]share.AckBatch)
	var add []share.TopicPartition
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			tp := share.TopicPartition{TopicID: t.TopicID, Partition: p.Partition}
			add = append(add, tp)
			if len(p.AcknowledgementBatches) > 0 {
				bs := make([]share.AckBatch, len(p.AcknowledgementBatches))
				for i, b := range p.AcknowledgementBatches {
					bs[i] = ackBatch(b.FirstOffset, b.LastOffset, b.AcknowledgeTypes)
				}
				acks[groupstate.ShareTP(tp)] = bs
			}
		}
	}
	renew := req.Version >= 2 && req.IsRenewAck
	if renew && (req.MaxBytes != 0 || req.MinBytes != 0 || req.MaxRecords != 0 || req.MaxWaitMillis != 0) {
		// KIP-1222: a renew carries acknowledgements only.
		fail(kerr.InvalidRequest.Code, "maxBytes, minBytes, maxRecords and maxWaitMs must be set to 0 if isRenewAck is true.")
		return
	}
	if req.ShareSessionEpoch == 0 && len(acks) > 0 {
		// Kafka: a new session carries no acknowledgements.
		fail(kerr.InvalidRequest.Code, "Acknowledge data present on initial fetch request")
		return
	}
	var forget []share.TopicPartition
	for _, t := range req.ForgottenTopicsData {
		for _, p := range t.Partitions {
			forget = append(forget, share.TopicPartition{TopicID: t.TopicID, Partition: p})
		}
	}
	parts, code := s.session(c, group, member, req.ShareSessionEpoch, add, forget)
	closing := req.ShareSessionEpoch == -1
	ackOnly := closing || renew
	if code != 0 {
		fail(code, "")
		return
	}
	ackCodes := s.validate(acks, renew)
	fetch := make([]groupstate.ShareTP, 0, len(parts))
	if !ackOnly {
		for _, tp := range parts {
			fetch = append(fetch, groupstate.ShareTP(tp))
		}
	}
	// Partitions of topics the cluster no longer has (deleted) are
	// answered as Kafka's KafkaApis does, before the group sees them.
	check := slices.Collect(maps.Keys(acks))
	gone := s.unknownTopics(append(check, fetch...), arrived)
	for tp := range acks {
		if code, ok := gone[tp]; ok {
			ackCodes[tp] = code
			delete(acks, tp)
		}
	}
	fetch = slices.DeleteFunc(fetch, func(tp groupstate.ShareTP) bool { _, ok := gone[tp]; return ok })
	plan := s.prepare(group, member, acks, fetch)
	out := newShareFetchOut(resp)
	deadline := time.Now().Add(time.Duration(req.MaxWaitMillis) * time.Millisecond)
	if ownerUnavailable(plan.Code) {
		// The group's owner could not be asked (it moves to another
		// kproxy, or is unreachable). The session's epoch moved on, so
		// the answer is the session's: its acknowledgements failed
		// (ackLost), and its fetch waits within MaxWaitMs for an owner,
		// then fetches, or acquires nothing, as a fetch that found no
		// records. A partition error would make clients set the
		// partition aside until their next metadata refresh, seconds
		// after the owner is back.
		for tp := range acks {
			ackCodes[tp] = ackLost
		}
		for !ackOnly && ownerUnavailable(plan.Code) && time.Until(deadline) > ownerRetry {
			select {
			case <-time.After(ownerRetry):
			case <-s.ctx.Done():
				fail(kerr.CoordinatorNotAvailable.Code, "")
				return
			}
			plan = s.prepare(group, member, nil, fetch)
		}
		if ownerUnavailable(plan.Code) {
			for tp, code := range ackCodes {
				out.partition(tp).AcknowledgeErrorCode = code
			}
			// The group's lock duration is the owner's to say; a
			// client takes a missing one as 1 s. Kafka's default
			// stands in.
			resp.AcquisitionLockTimeoutMillis = defaultLockMillis
			reply(resp)
			return
		}
	}
	if plan.Code != 0 {
		fail(plan.Code, "")
		return
	}
	for tp, code := range plan.AckCodes {
		ackCodes[tp] = ackCode(code)
	}
	resp.AcquisitionLockTimeoutMillis = int32(plan.Settings.LockDuration / time.Millisecond)
	for tp, code := range ackCodes {
		out.partition(tp).AcknowledgeErrorCode = code
	}
	if !ackOnly {
		for _, tp := range parts {
			if code, ok := gone[groupstate.ShareTP(tp)]; ok {
				out.partition(groupstate.ShareTP(tp)).ErrorCode = code
			}
		}
	}
	if closing {
		// The session ends: the member's records of its partitions go
		// back, after the acknowledgements it carried.
		s.cfg.Engine.ShareReleaseMember(group, member, parts)
		reply(resp)
		return
	}
	if renew {
		// KIP-1222: no fetch, or the renewed locks could run out before
		// the answer reached the client.
		reply(resp)
		return
	}
	if len(plan.Uninitialized) > 0 {
		if s.cfg.ConfigsRead != nil {
			if ch := s.cfg.ConfigsRead(group); ch != nil {
				t := time.NewTimer(500 * time.Millisecond)
				select {
				case <-ch:
					plan = s.prepare(group, member, nil, fetch)
				case <-t.C:
				}
				t.Stop()
			}
		}
	}
	if len(plan.Uninitialized) > 0 {
		if err := s.initialize(group, plan); err != nil {
			s.log.Warn("shares: resolving share-partition start offsets", "group", group, "err", err)
		} else {
			plan = s.prepare(group, member, nil, fetch)
		}
	}
	if req.MaxBytes <= 0 {
		// Kafka 4.4 splits MaxBytes among the partitions it fetches
		// (PartitionMaxBytesStrategy), which refuses 0: each partition
		// is answered UNKNOWN_SERVER_ERROR, no records.
		for _, tp := range fetch {
			p := out.partition(tp)
			p.ErrorCode = kerr.UnknownServerError.Code
			msg := "Request max bytes must be greater than 0"
			p.ErrorMessage = &msg
		}
		reply(resp)
		return
	}
	for {
		got := s.fetchAndAcquire(c, group, member, req, plan, out, deadline)
		if got || len(ackCodes) > 0 || len(gone) > 0 || !time.Now().Add(50*time.Millisecond).Before(deadline) {
			break
		}
		// Records were there but others hold them, or none were
		// acquirable: wait within MaxWaitMs, as Kafka's delayed share
		// fetch does, then look again.
		select {
		case <-time.After(50 * time.Millisecond):
		case <-s.ctx.Done():
			fail(kerr.CoordinatorNotAvailable.Code, "")
			return
		}
		plan = s.prepare(group, member, nil, fetch)
		if plan.Code != 0 {
			break
		}
	}
	reply(resp)
}

// ackLost answers an acknowledgement the group's owner could not be
// asked for: NOT_LEADER_OR_FOLLOWER, what a broker answers when a
// share-partition's leader changed, since either way the records the
// member held are no longer held for it (an owner that died took its
// acquisitions with it; the next one finds them available) and clients
// do not send such an acknowledgement again. The records come back to
// the group for another delivery.
var ackLost = kerr.NotLeaderForPartition.Code

// ackCode is what a client is answered for a partition's
// acknowledgements whose result at the group's owner was code: an owner
// that lost the group while its state write was in flight (fenced, or
// unloaded when its fleet lease ran out) answers NOT_COORDINATOR or the
// like for each partition; to the client that is ackLost, as when the
// owner could not be asked at all. Clients would keep such an
// acknowledgement to send again, and their FlushAcks would wait for an
// answer no share-partition leader gives.
func ackCode(code int16) int16 {
	if ownerUnavailable(code) {
		return ackLost
	}
	return code
}

// ownerRetry is how often a fetch asks again for a group whose owner
// could not be asked.
const ownerRetry = 100 * time.Millisecond

// defaultLockMillis is share.record.lock.duration.ms's default, answered
// when the group's owner could not be asked.
const defaultLockMillis = 30000

// ownerUnavailable says whether code means the group's state could not
// be reached for now (its owner moving, unreachable, or not this engine
// any more) rather than that the request was wrong.
func ownerUnavailable(code int16) bool {
	return code == kerr.CoordinatorNotAvailable.Code || code == kerr.NotCoordinator.Code || code == kerr.CoordinatorLoadInProgress.Code
}

// validate checks acknowledgement batches as Kafka 4.4 does; a partition
// whose batches are malformed is answered INVALID_REQUEST and its
// acknowledgements dropped from acks. renew allows the Renew type (a v2
// request with IsRenewAck).
func (s *Service) validate(acks map[groupstate.ShareTP][]share.AckBatch, renew bool) map[groupstate.ShareTP]int16 {
	codes := make(map[groupstate.ShareTP]int16)
	for tp, bs := range acks {
		if err := share.ValidateAckBatches(bs, renew); err != nil {
			codes[tp] = kerr.InvalidRequest.Code
			delete(acks, tp)
		}
	}
	return codes
}

// prepare runs SharePrepare and waits for its answer.
func (s *Service) prepare(group, member string, acks map[groupstate.ShareTP][]share.AckBatch, fetch []groupstate.ShareTP) groupstate.SharePlan {
	ch := make(chan groupstate.SharePlan, 1)
	s.cfg.Engine.SharePrepare(group, member, acks, fetch, func(p groupstate.SharePlan) { ch <- p })
	return <-ch
}

// initialize resolves the start offset of the plan's new partitions from
// share.auto.offset.reset and hands them to the engine.
func (s *Service) initialize(group string, plan groupstate.SharePlan) error {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	byName := make(map[string][]groupstate.ShareTP)
	for _, tp := range plan.Uninitialized {
		name, err := s.topicName(ctx, tp.TopicID)
		if err != nil {
			return err
		}
		byName[name] = append(byName[name], tp)
	}
	topics := make([]string, 0, len(byName))
	for name := range byName {
		topics = append(topics, name)
	}
	adm := kadm.NewClient(s.admin)
	earliest, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("listing start offsets of %v: %w", topics, err)
	}
	reset, err := s.resetOffsets(ctx, adm, group, plan.Settings.AutoOffsetReset, earliest, topics)
	if err != nil {
		return err
	}
	// A topic new to the group starts all its partitions at once, at
	// share.auto.offset.reset, as Kafka's coordinator initializes a
	// topic's share-partitions when it first assigns them: so a
	// partition fetched later by another member does not start later.
	// A partition added to a topic the group reads starts at the log's
	// start.
	starts := make(map[groupstate.ShareTP]int64)
	for name, tps := range byName {
		if plan.FromLogStart[tps[0]] { // the group reads the topic already
			for _, tp := range tps {
				if lo, ok := earliest.Lookup(name, tp.Partition); ok && lo.Err == nil {
					starts[tp] = lo.Offset
				}
			}
			continue
		}
		id := tps[0].TopicID
		reset.Each(func(lo kadm.ListedOffset) {
			if lo.Topic == name && lo.Err == nil && lo.Offset >= 0 {
				starts[groupstate.ShareTP{TopicID: id, Partition: lo.Partition}] = lo.Offset
			}
		})
	}
	done := make(chan int16, 1)
	s.cfg.Engine.ShareInitialize(group, starts, func(code int16) { done <- code })
	if code := <-done; code != 0 {
		return kerr.ErrorForCode(code)
	}
	return nil
}

// resetOffsets lists where the partitions of topics new to group start
// by its share.auto.offset.reset, as Kafka's SharePartition starts a
// share-partition with no state: the log's start (earliest, listed by
// the caller), the log's end (latest), or for by_duration the first
// record whose timestamp is at or after now minus the duration, the
// log's end where no record is that recent (kadm's ListOffsetsAfterMilli,
// as the Java consumer's by_duration does). A by_duration value that
// does not parse (Kafka and kproxy validate it when it is set) is logged
// and applied as latest.
func (s *Service) resetOffsets(ctx context.Context, adm *kadm.Client, group, reset string, earliest kadm.ListedOffsets, topics []string) (kadm.ListedOffsets, error) {
	if reset == "earliest" {
		return earliest, nil
	}
	d, isDur, err := groupstate.ShareResetDuration(reset)
	switch {
	case isDur && err == nil:
		// Kafka's Instant.now().minus(d).toEpochMilli(). A time before
		// 1970 is before every record, and a negative timestamp would
		// ask ListOffsets for one of its special offsets: the log's
		// start.
		at := time.Now().Add(-d).UnixMilli()
		if at < 0 {
			return earliest, nil
		}
		listed, err := adm.ListOffsetsAfterMilli(ctx, at, topics...)
		if err != nil {
			return nil, fmt.Errorf("listing offsets of %v at or after %d ms: %w", topics, at, err)
		}
		return listed, nil
	case isDur:
		if last := s.badReset.Swap(&reset); last == nil || *last != reset {
			s.log.Warn("shares: share.auto.offset.reset does not parse, applying latest", "group", group, "value", reset, "err", err)
		}
	}
	latest, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %v: %w", topics, err)
	}
	return latest, nil
}

// topicName returns the name of topic id, listing the cluster's topics
// when it is not known (at most once a second).
func (s *Service) topicName(ctx context.Context, id [16]byte) (string, error) {
	s.topicMu.Lock()
	ti, ok := s.names[id]
	s.topicMu.Unlock()
	if ok {
		return ti.name, nil
	}
	names, err := s.topics(ctx, time.Second)
	if err != nil {
		return "", err
	}
	if ti, ok := names[id]; ok {
		return ti.name, nil
	}
	return "", kerr.UnknownTopicID
}

// topics returns the cluster's topics by id, listed again when the last
// listing is older than maxAge.
func (s *Service) topics(ctx context.Context, maxAge time.Duration) (map[[16]byte]topicInfo, error) {
	s.topicMu.Lock()
	if time.Since(s.namesAt) < maxAge {
		names := s.names
		s.topicMu.Unlock()
		return names, nil
	}
	s.topicMu.Unlock()
	// A broker is asked directly: the client answers a metadata request
	// of all topics from its cache for up to its metadata min age (5 s).
	brokers := s.admin.DiscoveredBrokers()
	if len(brokers) == 0 {
		brokers = s.admin.SeedBrokers()
	}
	if len(brokers) == 0 {
		return nil, fmt.Errorf("listing topics: no broker known")
	}
	req := kmsg.NewPtrMetadataRequest()
	raw, err := brokers[0].Request(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("listing topics: %w", err)
	}
	md := raw.(*kmsg.MetadataResponse)
	names := make(map[[16]byte]topicInfo, len(md.Topics))
	for _, t := range md.Topics {
		if t.ErrorCode == 0 && t.Topic != nil {
			names[t.TopicID] = topicInfo{name: *t.Topic, partitions: int32(len(t.Partitions))}
		}
	}
	s.topicMu.Lock()
	s.names, s.namesAt = names, time.Now()
	s.topicMu.Unlock()
	return names, nil
}

// unknownTopics returns the code of each partition of tps whose topic or
// partition the cluster does not have, as Kafka's KafkaApis answers a
// ShareFetch or ShareAcknowledge partition: UNKNOWN_TOPIC_ID for a topic
// id its metadata lacks (a deleted topic), UNKNOWN_TOPIC_OR_PARTITION for
// a partition the topic lacks. A topic deleted is refused within a second
// (the listing's age when all is known), as a broker refuses it once its
// metadata has the deletion; one a listing lacks is looked for in a
// listing taken after the request arrived (at) before it is refused, so
// that a topic or partition created just before is not.
// When the topics cannot be listed, none is refused: the broker's fetch
// answers for them.
func (s *Service) unknownTopics(tps []groupstate.ShareTP, at time.Time) map[groupstate.ShareTP]int16 {
	if len(tps) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	codes, err := s.unknownIn(ctx, time.Second, tps)
	if err == nil && codes != nil {
		codes, err = s.unknownIn(ctx, time.Since(at), tps)
	}
	if err != nil {
		s.log.Debug("shares: checking the topics of a request", "err", err)
		return nil
	}
	return codes
}

// unknownIn returns unknownTopics' codes against a listing at most
// maxAge old.
func (s *Service) unknownIn(ctx context.Context, maxAge time.Duration, tps []groupstate.ShareTP) (map[groupstate.ShareTP]int16, error) {
	names, err := s.topics(ctx, maxAge)
	if err != nil {
		return nil, err
	}
	var codes map[groupstate.ShareTP]int16
	for _, tp := range tps {
		code := int16(0)
		if ti, ok := names[tp.TopicID]; !ok {
			code = kerr.UnknownTopicID.Code
		} else if tp.Partition < 0 || tp.Partition >= ti.partitions {
			code = kerr.UnknownTopicOrPartition.Code
		}
		if code != 0 {
			if codes == nil {
				codes = make(map[groupstate.ShareTP]int16)
			}
			codes[tp] = code
		}
	}
	return codes, nil
}

// fetchAndAcquire fetches the plan's partitions from the broker the
// client sent its request to and acquires what came back; it reports
// whether anything was acquired.
func (s *Service) fetchAndAcquire(c proxy.ShareConn, group, member string, req *kmsg.ShareFetchRequest, plan groupstate.SharePlan, out *shareFetchOut, deadline time.Time) bool {
	if len(plan.Offsets) == 0 {
		return false
	}
	f := kmsg.NewPtrFetchRequest()
	f.ReplicaID = -1
	f.SessionID, f.SessionEpoch = 0, -1
	f.MaxWaitMillis = int32(max(time.Until(deadline), 0) / time.Millisecond)
	f.MinBytes = max(req.MinBytes, 1)
	f.MaxBytes = req.MaxBytes // > 0: shareFetch answered 0
	if plan.Settings.ReadCommitted {
		f.IsolationLevel = 1
	}
	byTopic := make(map[[16]byte]int)
	for tp, off := range plan.Offsets {
		i, ok := byTopic[tp.TopicID]
		if !ok {
			t := kmsg.NewFetchRequestTopic()
			t.TopicID = tp.TopicID
			if name, err := s.topicName(s.ctx, tp.TopicID); err == nil {
				t.Topic = name // for brokers before topic ids in Fetch (v13)
			}
			f.Topics = append(f.Topics, t)
			i = len(f.Topics) - 1
			byTopic[tp.TopicID] = i
		}
		p := kmsg.NewFetchRequestTopicPartition()
		p.Partition, p.FetchOffset, p.CurrentLeaderEpoch, p.LogStartOffset = tp.Partition, off, -1, -1
		p.PartitionMaxBytes = f.MaxBytes
		f.Topics[i].Partitions = append(f.Topics[i].Partitions, p)
	}
	cl, err := s.lend()
	if err != nil {
		s.log.Warn("shares: fetch client", "err", err)
		return false
	}
	ctx, cancel := context.WithDeadline(s.ctx, deadline.Add(5*time.Second))
	node := c.Node
	if node < 0 {
		node = s.anyLeader(ctx, cl, f)
	}
	raw, err := cl.Broker(int(node)).Request(ctx, f)
	cancel()
	s.giveBack(cl)
	if err != nil {
		s.log.Debug("shares: fetch failed", "group", group, "node", node, "err", err)
		return false
	}
	fr := raw.(*kmsg.FetchResponse)
	type got struct {
		src     []byte
		batches []fetchedBatch
	}
	fetched := make(map[groupstate.ShareTP]groupstate.ShareFetched)
	data := make(map[groupstate.ShareTP]got)
	behind := make(map[groupstate.ShareTP]int64)
	for _, t := range fr.Topics {
		id := t.TopicID
		if id == ([16]byte{}) {
			for tid, i := range byTopic {
				if f.Topics[i].Topic == t.Topic {
					id = tid
				}
			}
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			tp := groupstate.ShareTP{TopicID: id, Partition: p.Partition}
			if p.ErrorCode != 0 {
				switch {
				case p.ErrorCode == kerr.OffsetOutOfRange.Code && p.LogStartOffset > plan.Offsets[tp]:
					// Records were deleted under the share-partition's
					// start: it moves to the log's start, and the next
					// fetch reads from there.
					behind[tp] = p.LogStartOffset
				case p.ErrorCode != kerr.OffsetOutOfRange.Code:
					out.partition(tp).ErrorCode = p.ErrorCode
				}
				continue
			}
			bs := readBatches(p, plan.Settings.ReadCommitted)
			if len(bs) == 0 {
				continue
			}
			sum := make([]share.Batch, len(bs))
			for i, b := range bs {
				sum[i] = b.Batch
			}
			fetched[tp] = groupstate.ShareFetched{FetchOffset: plan.Offsets[tp], Batches: sum}
			data[tp] = got{p.RecordBatches, bs}
		}
	}
	if len(behind) > 0 {
		s.cfg.Engine.ShareAdvance(group, behind)
	}
	if len(fetched) == 0 {
		return false
	}
	type acq struct {
		m    map[groupstate.ShareTP][]share.Acquired
		code int16
	}
	ch := make(chan acq, 1)
	// MaxRecords and BatchSize (v1+) are the client's max.poll.records;
	// a client that sends none gets Java's default of 500.
	maxRecords, batchSize := int(req.MaxRecords), int(req.BatchSize)
	if maxRecords <= 0 {
		maxRecords = 500
	}
	if batchSize <= 0 {
		batchSize = maxRecords
	}
	s.cfg.Engine.ShareAcquire(group, member, fetched, maxRecords, share.AcquireMode(req.ShareAcquireMode), batchSize,
		func(m map[groupstate.ShareTP][]share.Acquired, code int16) { ch <- acq{m, code} })
	a := <-ch
	any := false
	for tp, ranges := range a.m {
		d := data[tp]
		p := out.partition(tp)
		p.Records = acquiredBytes(d.src, d.batches, ranges)
		for _, r := range ranges {
			ar := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
			ar.FirstOffset, ar.LastOffset, ar.DeliveryCount = r.First, r.Last, r.DeliveryCount
			p.AcquiredRecords = append(p.AcquiredRecords, ar)
		}
		any = true
	}
	return any
}

// anyLeader picks a broker for a fetch that arrived on the bootstrap
// listener: the leader of the first partition, from the client's
// metadata.
func (s *Service) anyLeader(ctx context.Context, cl *kgo.Client, f *kmsg.FetchRequest) int32 {
	if len(f.Topics) == 0 || f.Topics[0].Topic == "" {
		return 0
	}
	md, err := kadm.NewClient(cl).Metadata(ctx, f.Topics[0].Topic)
	if err != nil {
		return 0
	}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			return p.Leader
		}
	}
	return 0
}

func (s *Service) shareAcknowledge(c proxy.ShareConn, req *kmsg.ShareAcknowledgeRequest, reply func(kmsg.Response)) {
	arrived := time.Now()
	resp := kmsg.NewPtrShareAcknowledgeResponse()
	resp.Version = req.Version
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	group, member := deref(req.GroupID), deref(req.MemberID)
	if group == "" || member == "" {
		fail(kerr.InvalidRequest.Code, "GroupId and MemberId are required")
		return
	}
	if req.ShareSessionEpoch == 0 {
		// Kafka: acknowledgements need a session.
		fail(kerr.InvalidShareSessionEpoch.Code, "")
		return
	}
	parts, code := s.session(c, group, member, req.ShareSessionEpoch, nil, nil)
	if code != 0 {
		fail(code, "")
		return
	}
	acks := make(map[groupstate.ShareTP][]share.AckBatch)
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			bs := make([]share.AckBatch, len(p.AcknowledgementBatches))
			for i, b := range p.AcknowledgementBatches {
				bs[i] = ackBatch(b.FirstOffset, b.LastOffset, b.AcknowledgeTypes)
			}
			acks[groupstate.ShareTP{TopicID: t.TopicID, Partition: p.Partition}] = bs
		}
	}
	codes := s.validate(acks, req.Version >= 2 && req.IsRenewAck)
	for tp, code := range s.unknownTopics(slices.Collect(maps.Keys(acks)), arrived) {
		codes[tp] = code
		delete(acks, tp)
	}
	plan := s.prepare(group, member, acks, nil)
	if ownerUnavailable(plan.Code) {
		// As in shareFetch: the session's epoch moved on; each
		// partition's acknowledgement failed.
		for tp := range acks {
			codes[tp] = ackLost
		}
	} else if plan.Code != 0 {
		fail(plan.Code, "")
		return
	}
	for tp, code := range plan.AckCodes {
		codes[tp] = ackCode(code)
	}
	if req.ShareSessionEpoch == -1 {
		s.cfg.Engine.ShareReleaseMember(group, member, parts)
	}
	if req.Version >= 2 {
		resp.AcquisitionLockTimeoutMillis = int32(plan.Settings.LockDuration / time.Millisecond)
		if resp.AcquisitionLockTimeoutMillis <= 0 {
			resp.AcquisitionLockTimeoutMillis = defaultLockMillis
		}
	}
	byTopic := make(map[[16]byte]int)
	for tp, code := range codes {
		i, ok := byTopic[tp.TopicID]
		if !ok {
			t := kmsg.NewShareAcknowledgeResponseTopic()
			t.TopicID = tp.TopicID
			resp.Topics = append(resp.Topics, t)
			i = len(resp.Topics) - 1
			byTopic[tp.TopicID] = i
		}
		p := kmsg.NewShareAcknowledgeResponseTopicPartition()
		p.Partition, p.ErrorCode = tp.Partition, code
		p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = -1, -1
		resp.Topics[i].Partitions = append(resp.Topics[i].Partitions, p)
	}
	reply(resp)
}

// shareFetchOut builds a ShareFetch response partition by partition.
type shareFetchOut struct {
	resp  *kmsg.ShareFetchResponse
	index map[groupstate.ShareTP][2]int
}

func newShareFetchOut(resp *kmsg.ShareFetchResponse) *shareFetchOut {
	return &shareFetchOut{resp: resp, index: make(map[groupstate.ShareTP][2]int)}
}

// partition returns tp's entry, adding it.
func (o *shareFetchOut) partition(tp groupstate.ShareTP) *kmsg.ShareFetchResponseTopicPartition {
	if at, ok := o.index[tp]; ok {
		return &o.resp.Topics[at[0]].Partitions[at[1]]
	}
	ti := -1
	for i := range o.resp.Topics {
		if o.resp.Topics[i].TopicID == tp.TopicID {
			ti = i
		}
	}
	if ti < 0 {
		t := kmsg.NewShareFetchResponseTopic()
		t.TopicID = tp.TopicID
		o.resp.Topics = append(o.resp.Topics, t)
		ti = len(o.resp.Topics) - 1
	}
	p := kmsg.NewShareFetchResponseTopicPartition()
	p.Partition = tp.Partition
	// Empty records, not null: see acquiredBytes.
	p.Records = []byte{}
	p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = -1, -1
	o.resp.Topics[ti].Partitions = append(o.resp.Topics[ti].Partitions, p)
	o.index[tp] = [2]int{ti, len(o.resp.Topics[ti].Partitions) - 1}
	return &o.resp.Topics[ti].Partitions[len(o.resp.Topics[ti].Partitions)-1]
}

// ackBatch converts a request's acknowledgement batch.
func ackBatch(first, last int64, types []int8) share.AckBatch {
	b := share.AckBatch{First: first, Last: last, Types: make([]share.AckType, len(types))}
	for i, t := range types {
		b.Types[i] = share.AckType(t)
	}
	return b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
