package proxy

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/authz"
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
// cache; a refresh, at most once per TTL, may make one request wait for
// DescribeAcls.
type Authorizer struct {
	inner   Coordinator
	cfg     AuthorizerConfig // immutable
	log     *slog.Logger     // immutable
	lastLog atomic.Int64     // nanotime of the last "ACLs unavailable" line
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

// can is the decision function for c's principal: every answer false
// when the ACLs cannot be read (fail closed).
func (a *Authorizer) can(c Client) authz.Can {
	never := func(kmsg.ACLResourceType, string, kmsg.ACLOperation) bool { return false }
	set, err := a.aclSet()
	if err != nil {
		if now, last := nanotime(), a.lastLog.Load(); now-last > int64(10*time.Second) && a.lastLog.CompareAndSwap(last, now) {
			a.log.Error("group requests denied: the cluster's ACLs cannot be read", "err", err)
		}
		return never
	}
	if set.NoAuthorizer {
		if a.cfg.RequireAuthorizer {
			return never
		}
		return func(kmsg.ACLResourceType, string, kmsg.ACLOperation) bool { return true }
	}
	principal := c.Principal
	if principal == "" {
		if c.Authenticated {
			return never // GSSAPI: the broker's principal is unknown here
		}
		principal = authz.Anonymous
	}
	return func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
		return set.Allowed(principal, c.Host, rt, name, op)
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
	d := authz.Authorize(req, a.can(c), a.topicNames(req))
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
// key needs DESCRIBE on the group.
func (a *Authorizer) AuthorizeFindCoordinator(c Client, group string) int16 {
	return authz.FindCoordinatorCode(a.can(c), 0, group)
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
