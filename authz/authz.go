// Package authz decides, from the cluster's own ACLs, whether a client's
// principal may do what a group request it sends kproxy asks (issue 9:
// "the client's own identity on every group request, the cluster's own
// authorization"). kproxy serves the group APIs itself, so the broker
// that would check a group request never sees it; this package makes the
// broker's decision instead. It is wired by proxy.Authorizer (a
// Coordinator in front of the engine or the fleet's Router) and
// internal/kproxy (--group-authorization).
//
// # Who the client is
//
// The client's identity is what its own connection established with the
// cluster: its SASL exchange, which passes through kproxy byte for byte
// to the broker that verifies it, or its client certificate on an mTLS
// listener. The session (proxy/sasl.go) learns:
//
//   - the mechanism, from the SaslHandshake request;
//   - the claimed user, from the client's first SaslAuthenticate bytes:
//     PLAIN's authcid and SCRAM's n= attribute ([SASLUser]),
//     OAUTHBEARER's token "sub" claim ([OAuthBearerSubject], Kafka's
//     default sasl.oauthbearer.sub.claim.name);
//   - whether the broker accepted it: a SaslAuthenticate response with
//     error code 0 that ends the exchange (PLAIN's first, SCRAM's second,
//     OAUTHBEARER's first when it carries no error challenge, GSSAPI's
//     last, the one without bytes). Only then is "User:<user>" the
//     principal; until then the session is unauthenticated.
//
// On an mTLS listener without SASL the principal is [CertPrincipal]:
// "User:" and the certificate subject in the RFC 2253 form Kafka's
// default ssl.principal.mapping.rules give. A connection with neither is
// [Anonymous]. A GSSAPI principal is the broker's mapping of a Kerberos
// name, which kproxy cannot reproduce: such a session is authenticated
// with an unknown principal, and every group request it sends is denied
// (fail closed). SaslHandshake v0, after which SASL tokens travel
// without Kafka framing, is refused (codec.RouteFor).
//
// # Unauthenticated connections
//
// When the upstream requires SASL (kproxy's own client is configured
// with it, proxy.Config.RequireSASL), a group request or FindCoordinator
// on a session that has not completed SASL gets what a Kafka broker
// does: the broker's SaslServerAuthenticator accepts only ApiVersions,
// SaslHandshake and SaslAuthenticate before authentication and closes
// the connection on anything else. kproxy closes the session the same
// way, touching no group state.
//
// # Decisions
//
// [Cache] reads every ACL with DescribeAcls (resource ANY, pattern ANY)
// through kproxy's own client (its principal needs DESCRIBE on the
// CLUSTER resource) and keeps the set for a TTL (default 10s; the
// assembly refreshes it ahead of expiry): a revoked ACL stops being
// honoured at most a TTL later, an added one starts at most a TTL later;
// a failed refresh keeps the last set for at most three TTLs, then the
// ACLs are unavailable ([ErrStale]): kproxy fails closed, but with the
// retriable COORDINATOR_NOT_AVAILABLE, since a read that failed is no
// verdict (proxy.Authorizer). A cluster without an authorizer answers
// SECURITY_DISABLED, and then everything is allowed ([Set.NoAuthorizer]),
// as its brokers allow it; a cluster last seen so keeps being treated so
// while its ACLs cannot be read ([Cache.Set]). [Set.Allowed] evaluates
// a (principal, host, resource, operation) as Kafka's StandardAuthorizer
// does: a matching DENY wins; an ALLOW for the operation, or for ALL, or
// (KIP-253) for READ/WRITE/DELETE/ALTER when DESCRIBE is asked, or
// ALTER_CONFIGS when DESCRIBE_CONFIGS is asked, allows; literal names
// match exactly or "*", prefixed names by prefix; principals exactly or
// "User:*"; hosts exactly or "*".
//
// Not visible through DescribeAcls, so configured on kproxy: the
// brokers' super.users and allow.everyone.if.no.acl.found. Without them
// a superuser's group requests through kproxy are denied where the
// broker would allow them. Custom authorizers and principal builders are
// not reproduced either; the probe route below would see them.
//
// # Per API (what Kafka's KafkaApis checks, [Authorize])
//
//	JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat: GROUP READ
//	OffsetCommit: GROUP READ, then TOPIC READ per topic
//	  (TOPIC_AUTHORIZATION_FAILED on that topic's partitions; a commit
//	  with no authorized topic left is answered without the coordinator)
//	TxnOffsetCommit: TRANSACTIONAL_ID WRITE, GROUP READ, then as OffsetCommit
//	OffsetFetch: GROUP DESCRIBE per group; topics without TOPIC DESCRIBE are
//	  left out (all-topics fetch) or answered TOPIC_AUTHORIZATION_FAILED
//	DescribeGroups, ConsumerGroupDescribe: GROUP DESCRIBE per group
//	  (authorized_operations computed for the principal when asked)
//	ListGroups: only groups with GROUP DESCRIBE (or all with CLUSTER DESCRIBE)
//	DeleteGroups: GROUP DELETE per group; OffsetDelete: GROUP DELETE, TOPIC READ
//	FindCoordinator (group key): GROUP DESCRIBE ([FindCoordinatorCode])
//	DescribeConfigs of GROUP resources (kproxy keeps them for a cluster
//	  without them): GROUP DESCRIBE_CONFIGS per group; AlterConfigs and
//	  IncrementalAlterConfigs: GROUP ALTER_CONFIGS per group; a denied
//	  group is answered GROUP_AUTHORIZATION_FAILED, the others go on
//
// A whole request denied is answered with codec.GroupErrorResponse;
// multi-group requests are authorized per group and the answers merged
// in request order. Topics given by id (v10) are named through the
// cluster's metadata; an id that cannot be named is denied.
//
// # The probe route (alternative, not built)
//
// Instead of reading ACLs, send on the client's own authenticated
// upstream connection a request the broker authorizes before anything
// else and that changes nothing: Heartbeat{group, member "", generation
// -1} answers GROUP_AUTHORIZATION_FAILED or, authorized, an error about
// the member or the coordinator; OffsetFetch{group, topics} shows topic
// DESCRIBE. It sees super.users, custom authorizers and GSSAPI
// principals exactly as the broker does, at the cost of injecting
// requests into the session's upstream stream (a correlation id of
// kproxy's own, a response consumed rather than forwarded) in the
// session's reader and writer.
package authz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ACL is one access control entry, as DescribeAcls returns it.
type ACL struct {
	Principal    string // "User:alice" or "User:*"
	Host         string // an IP or "*"
	ResourceType kmsg.ACLResourceType
	ResourceName string
	Pattern      kmsg.ACLResourcePatternType
	Operation    kmsg.ACLOperation
	Permission   kmsg.ACLPermissionType
}

func (a *ACL) matches(principal, host string, rt kmsg.ACLResourceType, name string) bool {
	if a.ResourceType != rt || (a.Principal != principal && a.Principal != "User:*") || (a.Host != host && a.Host != "*") {
		return false
	}
	switch a.Pattern {
	case kmsg.ACLResourcePatternTypeLiteral:
		return a.ResourceName == name || a.ResourceName == "*"
	case kmsg.ACLResourcePatternTypePrefixed:
		return strings.HasPrefix(name, a.ResourceName)
	}
	return false
}

// grants says whether an ALLOW entry for a.Operation covers op (KIP-253
// implications).
func (a *ACL) grants(op kmsg.ACLOperation) bool {
	if a.Operation == kmsg.ACLOperationAll || a.Operation == op {
		return true
	}
	switch op {
	case kmsg.ACLOperationDescribe:
		switch a.Operation {
		case kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationDelete, kmsg.ACLOperationAlter:
			return true
		}
	case kmsg.ACLOperationDescribeConfigs:
		return a.Operation == kmsg.ACLOperationAlterConfigs
	}
	return false
}

// Set is an immutable set of ACLs with the broker settings DescribeAcls
// does not show.
type Set struct {
	ACLs []ACL
	// SuperUsers are principals every check allows (the brokers'
	// super.users).
	SuperUsers map[string]bool
	// AllowIfNoACL allows a resource no ACL names (the brokers'
	// allow.everyone.if.no.acl.found).
	AllowIfNoACL bool
	// NoAuthorizer says the cluster has no authorizer (DescribeAcls
	// answered SECURITY_DISABLED): a broker then allows everything, and
	// so does Allowed.
	NoAuthorizer bool
	// AnonymousCluster says kproxy's own client reaches the cluster
	// without SASL and without a client certificate, so the cluster
	// knows it, and every client of that listener, as User:ANONYMOUS.
	// Then an empty ACL list read successfully allows everything: the
	// read itself shows that ANONYMOUS is a super user, that the
	// brokers allow everyone where no ACL is found, or that the cluster
	// enforces nothing while answering DescribeAcls (kfake without
	// ACLs, some Kafka-compatible brokers); in each case a direct
	// client's group request would be served. Once an ACL exists, the
	// ACLs decide as usual.
	AnonymousCluster bool

	// idx, when built (Cache builds it for every set it reads), narrows
	// Allowed to the ACLs that can name the resource; nil scans them
	// all. Immutable once built.
	idx *aclIndex
}

// aclIndex groups a set's ACLs by what they name.
type aclIndex struct {
	literal  map[resourceKey][]int32          // literal names, "*" included, by type and name
	prefixed map[kmsg.ACLResourceType][]int32 // prefixed names, by type
}

type resourceKey struct {
	rt   kmsg.ACLResourceType
	name string
}

// indexed returns s with its index built.
func (s Set) indexed() Set {
	idx := &aclIndex{literal: map[resourceKey][]int32{}, prefixed: map[kmsg.ACLResourceType][]int32{}}
	for i, a := range s.ACLs {
		switch a.Pattern {
		case kmsg.ACLResourcePatternTypeLiteral:
			k := resourceKey{a.ResourceType, a.ResourceName}
			idx.literal[k] = append(idx.literal[k], int32(i))
		case kmsg.ACLResourcePatternTypePrefixed:
			idx.prefixed[a.ResourceType] = append(idx.prefixed[a.ResourceType], int32(i))
		}
	}
	s.idx = idx
	return s
}

// Allowed says whether principal, connecting from host, may perform op
// on the resource.
func (s *Set) Allowed(principal, host string, rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
	if s == nil {
		return false
	}
	if s.NoAuthorizer || s.SuperUsers[principal] || s.AnonymousCluster && len(s.ACLs) == 0 {
		return true
	}
	allowed, named := false, false
	// check evaluates one ACL; false means a DENY matched.
	check := func(a *ACL) bool {
		if a.ResourceType == rt && (a.Pattern == kmsg.ACLResourcePatternTypePrefixed && strings.HasPrefix(name, a.ResourceName) ||
			a.Pattern == kmsg.ACLResourcePatternTypeLiteral && (a.ResourceName == name || a.ResourceName == "*")) {
			named = true
		}
		if !a.matches(principal, host, rt, name) {
			return true
		}
		switch a.Permission {
		case kmsg.ACLPermissionTypeDeny:
			if a.Operation == kmsg.ACLOperationAll || a.Operation == op {
				return false
			}
		case kmsg.ACLPermissionTypeAllow:
			if a.grants(op) {
				allowed = true
			}
		}
		return true
	}
	if s.idx == nil {
		for i := range s.ACLs {
			if !check(&s.ACLs[i]) {
				return false
			}
		}
		return allowed || (!named && s.AllowIfNoACL)
	}
	for _, list := range [3][]int32{s.idx.literal[resourceKey{rt, name}], s.idx.literal[resourceKey{rt, "*"}], s.idx.prefixed[rt]} {
		for _, i := range list {
			if !check(&s.ACLs[i]) {
				return false
			}
		}
	}
	return allowed || (!named && s.AllowIfNoACL)
}

// Fetch reads every ACL of the cluster with DescribeAcls.
func Fetch(ctx context.Context, cl *kgo.Client) ([]ACL, error) {
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType = kmsg.ACLResourceTypeAny
	req.ResourcePatternType = kmsg.ACLResourcePatternTypeAny
	req.Operation = kmsg.ACLOperationAny
	req.PermissionType = kmsg.ACLPermissionTypeAny
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("describe acls: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		msg := ""
		if resp.ErrorMessage != nil {
			msg = ": " + *resp.ErrorMessage
		}
		return nil, fmt.Errorf("describe acls: %w%s", err, msg)
	}
	var out []ACL
	for _, r := range resp.Resources {
		for _, a := range r.ACLs {
			out = append(out, ACL{Principal: a.Principal, Host: a.Host, ResourceType: r.ResourceType,
				ResourceName: r.ResourceName, Pattern: r.ResourcePatternType, Operation: a.Operation, Permission: a.PermissionType})
		}
	}
	return out, nil
}

// Cache serves decisions from the cluster's ACLs, read again once per
// TTL by Set, or every half TTL by RefreshAhead. Safe for concurrent use.
type Cache struct {
	fetch func(context.Context) ([]ACL, error) // immutable
	ttl   time.Duration                        // immutable
	base  Set                                  // immutable: super users, allow-if-no-ACL

	mu       sync.Mutex
	set      *Set          // guarded by mu: nil until the first fetch succeeds
	fetched  time.Time     // guarded by mu: when set was read
	tried    time.Time     // guarded by mu: last fetch attempt
	lastErr  error         // guarded by mu
	inflight chan struct{} // guarded by mu: closed when the running fetch ends; nil when none runs
}

// NewCache returns a cache over cl's view of the ACLs; base carries the
// settings DescribeAcls cannot show. ttl <= 0 means 10s.
func NewCache(cl *kgo.Client, base Set, ttl time.Duration) *Cache {
	return newCache(func(ctx context.Context) ([]ACL, error) { return Fetch(ctx, cl) }, base, ttl)
}

func newCache(fetch func(context.Context) ([]ACL, error), base Set, ttl time.Duration) *Cache {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	return &Cache{fetch: fetch, ttl: ttl, base: base}
}

// ErrStale says the ACLs could not be read for three TTLs. It wraps the
// last read's error. Not being able to read the ACLs is unavailability,
// not a verdict: a caller answers with a retriable error (kproxy's
// Authorizer answers COORDINATOR_NOT_AVAILABLE), never with an
// authorization failure.
var ErrStale = errors.New("authz: cluster ACLs unavailable")

// Fresh returns the set when it was read within the TTL, without
// blocking; nil when it must be read again (Set).
func (c *Cache) Fresh() *Set {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.set != nil && time.Since(c.fetched) < c.ttl {
		return c.set
	}
	return nil
}

// Set returns the current ACL set, reading it again when older than the
// TTL. One read runs at a time, outside the lock: while it runs, callers
// get the previous set if it is still usable (under three TTLs old) and
// otherwise wait for the read (or ctx).
//
// When no read succeeded for three TTLs the error wraps ErrStale. If the
// last successful read found no authorizer (SECURITY_DISABLED), that set
// is returned beside the error, at once: whether a cluster has an
// authorizer is a broker setting (authorizer.class.name, KIP-500's
// StandardAuthorizer or the ZooKeeper-era AclAuthorizer) that changes
// only with a restart of its brokers, so a read that fails says nothing
// about it, and such a cluster keeps being treated as one without an
// authorizer. ACLs, which change at any time, are never used past three
// TTLs: the set is nil then.
func (c *Cache) Set(ctx context.Context) (*Set, error) {
	c.mu.Lock()
	for {
		now := time.Now()
		if c.set != nil && now.Sub(c.fetched) < c.ttl {
			s := c.set
			c.mu.Unlock()
			return s, nil
		}
		usable := c.set != nil && now.Sub(c.fetched) < 3*c.ttl
		noAuthorizer := c.set != nil && c.set.NoAuthorizer
		if c.inflight == nil && (c.set == nil || now.Sub(c.tried) >= c.ttl/4) {
			if s := c.readLocked(ctx); s != nil {
				c.mu.Unlock()
				return s, nil
			}
		} else if c.inflight != nil && !usable && !noAuthorizer {
			wait := c.inflight
			c.mu.Unlock()
			select {
			case <-wait:
				c.mu.Lock()
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %w", ErrStale, ctx.Err())
			}
		}
		if usable {
			s := c.set
			c.mu.Unlock()
			return s, nil
		}
		err := c.lastErr
		if err == nil {
			err = errors.New("no read finished yet")
		}
		var s *Set
		if noAuthorizer {
			s = c.set
		}
		c.mu.Unlock()
		return s, fmt.Errorf("%w: %w", ErrStale, err)
	}
}

// readLocked reads the ACLs once, c.mu held on entry and on return and
// released during the read (no read may be running). It returns the set
// read, or nil after a failed read (c.lastErr).
func (c *Cache) readLocked(ctx context.Context) *Set {
	done := make(chan struct{})
	c.inflight, c.tried = done, time.Now()
	c.mu.Unlock()
	acls, err := c.fetch(ctx)
	c.mu.Lock()
	c.inflight = nil
	close(done)
	if err == nil || errors.Is(err, kerr.SecurityDisabled) {
		s := c.base
		s.ACLs, s.NoAuthorizer = acls, err != nil
		s = s.indexed()
		c.set, c.fetched, c.lastErr = &s, time.Now(), nil
		return &s
	}
	c.lastErr = err
	return nil
}

// Refresh reads the ACLs now, however young the set is, unless a read is
// running already; it returns once its read ended.
func (c *Cache) Refresh(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight == nil {
		c.readLocked(ctx)
	}
}

// RefreshAhead reads the ACLs every half TTL until ctx ends, so that the
// set is renewed before it expires and no request waits for DescribeAcls
// on its own goroutine (Set reads only once the set is past its TTL). A
// request still waits when a read took longer than half the TTL, or
// failed. Calling Set from the ticker instead does not refresh ahead:
// the set is timed from the end of its read, so the tick one TTL after a
// read comes a round trip too early, finds the set fresh, and the next
// group request after the expiry pays the read.
func (c *Cache) RefreshAhead(ctx context.Context) {
	t := time.NewTicker(c.ttl / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, c.ttl)
		c.Refresh(rctx)
		cancel()
	}
}

// Allowed is Set(ctx).Allowed, failing closed on ACLs that cannot be
// read (a cluster last seen without an authorizer allows, see Set).
func (c *Cache) Allowed(ctx context.Context, principal, host string, rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
	s, _ := c.Set(ctx)
	return s != nil && s.Allowed(principal, host, rt, name, op)
}

// SASLUser returns the user a client claims in its first
// SaslAuthenticate bytes for mechanism (PLAIN or SCRAM-SHA-256/512). It
// is the principal only once the broker has accepted the exchange.
func SASLUser(mechanism string, auth []byte) (string, bool) {
	switch mechanism {
	case "PLAIN":
		// authzid NUL authcid NUL passwd (RFC 4616); Kafka requires
		// authzid empty or equal to authcid.
		parts := bytes.SplitN(auth, []byte{0}, 3)
		if len(parts) != 3 || len(parts[1]) == 0 || (len(parts[0]) > 0 && !bytes.Equal(parts[0], parts[1])) {
			return "", false
		}
		return string(parts[1]), true
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		// gs2-header "n,," [or "n,a=authzid,"] then n=user,r=nonce
		// (RFC 5802); "=2C" and "=3D" escape ',' and '='.
		s := string(auth)
		i := strings.Index(s, ",n=")
		if i < 0 || !strings.HasPrefix(s, "n,") && !strings.HasPrefix(s, "y,") {
			return "", false
		}
		user := s[i+3:]
		if j := strings.IndexByte(user, ','); j >= 0 {
			user = user[:j]
		}
		user = strings.NewReplacer("=2C", ",", "=3D", "=").Replace(user)
		return user, user != ""
	}
	return "", false
}
