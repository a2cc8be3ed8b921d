package proxy

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/authz"
	"github.com/kproxy/kproxy/codec"
)

// ACLSource gives the cluster's current ACLs (authz.Cache).
type ACLSource interface {
	// Fresh returns the ACLs when they are current, without blocking;
	// nil otherwise. Every request asks it first, so that the common
	// case costs no context and no timer.
	Fresh() *authz.Set
	// Set returns the ACLs, reading them from the cluster if they are
	// stale, within ctx.
	Set(ctx context.Context) (*authz.Set, error)
}

// AuthorizerConfig configures NewAuthorizer.
type AuthorizerConfig struct {
	// ACLs is where every decision comes from. Required.
	ACLs ACLSource
	// RequireAuthorizer denies everything while the cluster has no
	// authorizer (a cluster-acls deployment whose brokers lost theirs)
	// instead of allowing everything as such a broker does.
	RequireAuthorizer bool
	// TopicNames names the topics OffsetCommit and OffsetFetch v10 give
	// by id; nil, or an id it cannot name, denies that topic.
	TopicNames func(ctx context.Context, ids [][16]byte) (map[[16]byte]string, error)
	// Timeout bounds reading the ACLs and topic names for one request;
	// default 5s. A request that cannot be decided is denied.
	Timeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Authorizer is the Coordinator in front of the one that serves groups
// (the engine, or the fleet's Router, so that a relayed request is
// checked by the kproxy its client is connected to, which alone knows
// the client's identity). Every group request is authorized for the
// client's principal as a Kafka broker authorizes it (authz.Authorize)
// before the inner coordinator sees it: a denied request, or the denied
// groups and topics of one, are answered GROUP_AUTHORIZATION_FAILED or
// TOPIC_AUTHORIZATION_FAILED without touching group state.
//
// The principal is Client.Principal; a client that did not authenticate
// is "User:ANONYMOUS", as on a broker's PLAINTEXT listener; one that
// authenticated with a mechanism whose principal kproxy cannot know
// (GSSAPI) is denied every group request.
//
// Handle decides on the caller's goroutine (the session's reader), so
// the requests of one connection reach the inner coordinator in the
// order they were sent, as on a broker. The decision reads the ACL
// cache, which kproxy refreshes every half TTL (authz.Cache.RefreshAhead);
// only when such a read is slower than half the TTL, or fails, does a
// request wait for DescribeAcls, and with it the requests behind it on
// its connection.
//
// ACLs that cannot be read (authz.ErrStale: no read succeeded for three
// TTLs) are unavailability, not a verdict. Every group request and
// FindCoordinator is then answered COORDINATOR_NOT_AVAILABLE, still
// without touching group state (fail closed), because that is the error
// every group API's client retries after looking the coordinator up
// again (Kafka's AbstractCoordinator for JoinGroup, SyncGroup and
// Heartbeat, ConsumerCoordinator for OffsetCommit and OffsetFetch,
// TransactionManager for TxnOffsetCommit, the admin client's handlers
// for DescribeGroups, ListGroups, DeleteGroups and OffsetDelete), where
// GROUP_AUTHORIZATION_FAILED is fatal to a Java consumer's poll. A
// cluster last seen without an authorizer keeps being treated as one
// (authz.Cache.Set). Each episode is logged once at WARN when it starts
// and once at INFO when the ACLs are read again.
type Authorizer struct {
	inner Coordinator
	cfg   AuthorizerConfig // immutable
	log   *slog.Logger     // immutable

	// episode is the aclEpisode the decisions are in; changed only by
	// compare-and-swap, and whoever swaps logs the change, so each
	// episode is logged once however many sessions see it.
	episode atomic.Int32
	// episodeStart is the nanotime the current episode began; written
	// by the goroutine that swapped episode.
	episodeStart atomic.Int64
}

// aclEpisode is how the Authorizer's decisions currently stand.
type aclEpisode int32

const (
	aclsReadable     aclEpisode = iota // the ACLs were read within three TTLs
	aclsUnavailable                    // stale: group requests get COORDINATOR_NOT_AVAILABLE
	aclsStaleNoAuthz                   // stale, but last seen without an authorizer: allowed
)

// String returns the episode's name as it appears in logs.
func (e aclEpisode) String() string {
	switch e {
	case aclsReadable:
		return "readable"
	case aclsUnavailable:
		return "unavailable"
	case aclsStaleNoAuthz:
		return "stale_no_authorizer"
	}
	return "unknown"
}

// NewAuthorizer returns inner behind group authorization.
func NewAuthorizer(inner Coordinator, cfg AuthorizerConfig) *Authorizer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authorizer{inner: inner, cfg: cfg, log: log}
}

// can is the decision function for c's principal; ok=false when the
// ACLs cannot be read, and the request must be answered
// COORDINATOR_NOT_AVAILABLE instead.
func (a *Authorizer) can(c Client) (can authz.Can, ok bool) {
	never := func(kmsg.ACLResourceType, string, kmsg.ACLOperation) bool { return false }
	set, err := a.aclSet()
	switch {
	case err == nil:
		a.enter(aclsReadable, nil)
	case set != nil && set.NoAuthorizer:
		a.enter(aclsStaleNoAuthz, err)
	default:
		a.enter(aclsUnavailable, err)
		return never, false
	}
	if set.NoAuthorizer {
		if a.cfg.RequireAuthorizer {
			return never, true
		}
		return func(kmsg.ACLResourceType, string, kmsg.ACLOperation) bool { return true }, true
	}
	principal := c.Principal
	if principal == "" {
		if c.Authenticated {
			return never, true // GSSAPI: the broker's principal is unknown here
		}
		principal = authz.Anonymous
	}
	return func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
		return set.Allowed(principal, c.Host, rt, name, op)
	}, true
}

// enter moves the decisions to episode e, logging the change once.
func (a *Authorizer) enter(e aclEpisode, err error) {
	prev := aclEpisode(a.episode.Load())
	if prev == e || !a.episode.CompareAndSwap(int32(prev), int32(e)) {
		return
	}
	now := nanotime()
	began := a.episodeStart.Swap(now)
	switch e {
	case aclsUnavailable:
		a.log.Warn("the cluster's ACLs cannot be read: group requests are answered COORDINATOR_NOT_AVAILABLE (retriable) until they can",
			"err", err, "previous", prev.String())
	case aclsStaleNoAuthz:
		a.log.Warn("the cluster's ACLs cannot be read; it was last seen without an authorizer, so group requests stay allowed, as its brokers allow them",
			"err", err)
	case aclsReadable:
		a.log.Info("the cluster's ACLs are readable again: group requests are authorized with them",
			"was", prev.String(), "for", time.Duration(now-began).Round(time.Millisecond).String())
	}
}

// aclSet returns the current ACLs, reading them within the timeout
// when they are stale.
func (a *Authorizer) aclSet() (*authz.Set, error) {
	if s := a.cfg.ACLs.Fresh(); s != nil {
		return s, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	return a.cfg.ACLs.Set(ctx)
}

// Handle implements Coordinator.
func (a *Authorizer) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	can, ok := a.can(c)
	if !ok {
		reply(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
		return
	}
	d := authz.Authorize(req, can, a.topicNames(req))
	if d.Answer != nil {
		a.log.Debug("group request denied", "api", kmsg.NameForKey(req.Key()), "principal", c.Principal, "client", c.ID, "host", c.Host)
		reply(d.Answer)
		return
	}
	if d.Finish == nil {
		a.inner.Handle(c, d.Pass, reply)
		return
	}
	a.inner.Handle(c, d.Pass, func(resp kmsg.Response) { reply(d.Finish(resp)) })
}

// AuthorizeFindCoordinator implements FindCoordinatorAuthorizer: a group
// key needs DESCRIBE on the group; while the ACLs cannot be read the
// answer is COORDINATOR_NOT_AVAILABLE, which a client retries.
func (a *Authorizer) AuthorizeFindCoordinator(c Client, group string) int16 {
	can, ok := a.can(c)
	if !ok {
		return errCoordinatorNotAvailable
	}
	return authz.FindCoordinatorCode(can, 0, group)
}

// topicNames names the topic ids of req and of its answer (an
// all-topics OffsetFetch v10 answers with ids): those req gives are
// resolved at once, any other on first use.
func (a *Authorizer) topicNames(req kmsg.Request) authz.TopicName {
	if a.cfg.TopicNames == nil {
		return nil
	}
	var ids [][16]byte
	add := func(name string, id [16]byte) {
		if name == "" && id != ([16]byte{}) {
			ids = append(ids, id)
		}
	}
	switch r := req.(type) {
	case *kmsg.OffsetCommitRequest:
		for _, t := range r.Topics {
			add(t.Topic, t.TopicID)
		}
	case *kmsg.OffsetFetchRequest:
		for _, g := range r.Groups {
			for _, t := range g.Topics {
				add(t.Topic, t.TopicID)
			}
		}
	case *kmsg.ShareFetchRequest:
		for _, t := range r.Topics {
			add("", t.TopicID)
		}
	case *kmsg.ShareAcknowledgeRequest:
		for _, t := range r.Topics {
			add("", t.TopicID)
		}
	default:
		return nil
	}
	var names map[[16]byte]string
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
		var err error
		names, err = a.cfg.TopicNames(ctx, ids)
		cancel()
		if err != nil {
			a.log.Warn("topic ids cannot be named: their offsets are denied", "err", err)
		}
	}
	return func(id [16]byte) (string, bool) {
		if n, ok := names[id]; ok {
			return n, true
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
		defer cancel()
		m, err := a.cfg.TopicNames(ctx, [][16]byte{id})
		n, ok := m[id]
		return n, ok && err == nil
	}
}
