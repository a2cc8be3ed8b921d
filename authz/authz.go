// Package authz decides, from the cluster's own ACLs, whether a client's
// principal may do what a group request it sends kproxy asks (issue 9:
// "the client's own identity on every group request, the cluster's own
// authorization"). It is not wired into the data path yet; this comment
// is the design, and says which parts exist.
//
// # Who the client is
//
// kproxy serves group APIs itself, so the broker that would check a
// group request never sees it. The client's identity is what its own
// connection established with the cluster: its SASL exchange, which
// passes through kproxy byte for byte to the broker that verifies it, or
// its client certificate on an mTLS listener. A session learns:
//
//   - the mechanism, from the SaslHandshake request;
//   - the claimed user, from the client's first SaslAuthenticate bytes
//     (PLAIN: authzid NUL authcid NUL password; SCRAM: the client-first
//     message's n= attribute), parsed by [SASLUser] (exists);
//   - whether the broker accepted it: a SaslAuthenticate response with
//     error code 0 that ends the exchange (PLAIN's first, SCRAM's second).
//     Only then is "User:<user>" the principal; until then the session is
//     unauthenticated.
//
// OAUTHBEARER and GSSAPI principals cannot be read off the exchange
// (the broker maps a token claim or a Kerberos name through its own
// rules); for them only the authenticated/unauthenticated gate applies
// (below), and groups fall back to the probe design (last section).
//
// # Unauthenticated connections
//
// When the upstream requires SASL (kproxy's own client is configured
// with it), a group request on a session that has not completed SASL
// gets what a Kafka broker does: the broker's SaslServerAuthenticator
// accepts only ApiVersions, SaslHandshake and SaslAuthenticate before
// authentication and closes the connection on anything else
// (IllegalSaslStateException). kproxy closes the session the same way,
// touching no group state.
//
// # Decisions
//
// [Cache] reads every ACL with DescribeAcls (resource ANY, pattern ANY)
// through kproxy's own client (its principal needs DESCRIBE on the
// CLUSTER resource) and keeps the set for a TTL (default 10s): a revoked
// ACL stops being honoured at most a TTL later, an added one starts at
// most a TTL later; a failed refresh keeps the last set for at most
// three TTLs, then every decision is "deny" (fail closed). [Set.Allowed]
// evaluates a (principal, host, resource, operation) as Kafka's
// StandardAuthorizer does: a matching DENY wins; an ALLOW for the
// operation, or for ALL, or (KIP-253) for READ/WRITE/DELETE/ALTER when
// DESCRIBE is asked, or ALTER_CONFIGS when DESCRIBE_CONFIGS is asked,
// allows; literal names match exactly or "*", prefixed names by prefix;
// principals exactly or "User:*"; hosts exactly or "*".
//
// Not visible through DescribeAcls, so configured on kproxy: the
// brokers' super.users and allow.everyone.if.no.acl.found. Without them
// a superuser's group requests through kproxy are denied where the broker
// would allow them. This is the weakness of this route; the probe route
// below has none.
//
// # Per API (what Kafka's KafkaApis checks)
//
//	JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat: GROUP READ
//	OffsetCommit, TxnOffsetCommit: GROUP READ, then TOPIC READ per topic
//	  (TOPIC_AUTHORIZATION_FAILED on that topic's partitions)
//	OffsetFetch: GROUP DESCRIBE, topics without TOPIC DESCRIBE are left out
//	  (all-topics fetch) or answered TOPIC_AUTHORIZATION_FAILED
//	DescribeGroups, ConsumerGroupDescribe: GROUP DESCRIBE per group
//	ListGroups: only groups with GROUP DESCRIBE (or all with CLUSTER DESCRIBE)
//	DeleteGroups: GROUP DELETE per group; OffsetDelete: GROUP DELETE, TOPIC READ
//	FindCoordinator (group key): GROUP DESCRIBE
//
// The check belongs in a proxy.Coordinator wrapper in front of the
// Router (so relayed requests are checked by the kproxy the client is
// connected to, which alone knows its identity), answering the error
// response itself and filtering ListGroups/OffsetFetch answers.
//
// # The probe route (alternative, not built)
//
// Instead of reading ACLs, send on the client's own authenticated
// upstream connection a request the broker authorizes before anything
// else and that changes nothing: Heartbeat{group, member "", generation
// -1} answers GROUP_AUTHORIZATION_FAILED or, authorized, an error about
// the member or the coordinator; OffsetFetch{group, topics} shows topic
// DESCRIBE. It sees super.users, custom authorizers and OAUTHBEARER or
// GSSAPI principals exactly as the broker does, at the cost of injecting
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
}

// Allowed says whether principal, connecting from host, may perform op
// on the resource.
func (s *Set) Allowed(principal, host string, rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
	if s == nil {
		return false
	}
	if s.NoAuthorizer || s.SuperUsers[principal] {
		return true
	}
	allowed, named := false, false
	for i := range s.ACLs {
		a := &s.ACLs[i]
		if a.ResourceType == rt && (a.Pattern == kmsg.ACLResourcePatternTypePrefixed && strings.HasPrefix(name, a.ResourceName) ||
			a.Pattern == kmsg.ACLResourcePatternTypeLiteral && (a.ResourceName == name || a.ResourceName == "*")) {
			named = true
		}
		if !a.matches(principal, host, rt, name) {
			continue
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

// Cache serves decisions from the cluster's ACLs, read at most once per
// TTL. Safe for concurrent use.
type Cache struct {
	fetch func(context.Context) ([]ACL, error) // immutable
	ttl   time.Duration                        // immutable
	base  Set                                  // immutable: super users, allow-if-no-ACL

	mu      sync.Mutex
	set     *Set      // guarded by mu: nil until the first fetch succeeds
	fetched time.Time // guarded by mu: when set was read
	tried   time.Time // guarded by mu: last fetch attempt
	lastErr error     // guarded by mu
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

// ErrStale says the ACLs could not be read for three TTLs: every
// decision is a denial until they can.
var ErrStale = errors.New("authz: cluster ACLs unavailable")

// Set returns the current ACL set, reading it again when older than the
// TTL. Concurrent callers share one read (the lock is held across it).
func (c *Cache) Set(ctx context.Context) (*Set, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.set != nil && now.Sub(c.fetched) < c.ttl {
		return c.set, nil
	}
	if now.Sub(c.tried) >= c.ttl/4 || c.set == nil {
		c.tried = now
		acls, err := c.fetch(ctx)
		if err == nil || errors.Is(err, kerr.SecurityDisabled) {
			s := c.base
			s.ACLs, s.NoAuthorizer = acls, err != nil
			c.set, c.fetched, c.lastErr = &s, now, nil
			return c.set, nil
		}
		c.lastErr = err
	}
	if c.set != nil && now.Sub(c.fetched) < 3*c.ttl {
		return c.set, nil
	}
	return nil, fmt.Errorf("%w: %v", ErrStale, c.lastErr)
}

// Allowed is Set(ctx).Allowed, failing closed.
func (c *Cache) Allowed(ctx context.Context, principal, host string, rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
	s, err := c.Set(ctx)
	return err == nil && s.Allowed(principal, host, rt, name, op)
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
