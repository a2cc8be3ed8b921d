package kproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kproxy/kproxy/authz"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/proxy"
)

// AuthorizationMode says how group requests kproxy serves itself are
// authorized (package authz).
type AuthorizationMode string

const (
	// AuthorizationOff serves every group request to anyone who can
	// connect (and, with Proxy.RequireSASL, has authenticated). The
	// assembly's zero value: the in-memory dev cluster has no ACLs.
	AuthorizationOff AuthorizationMode = "off"
	// AuthorizationAuto authorizes with the cluster's ACLs read with
	// DescribeAcls; a cluster without an authorizer (SECURITY_DISABLED)
	// allows everything, as its brokers do. The command's default.
	AuthorizationAuto AuthorizationMode = "auto"
	// AuthorizationClusterACLs is auto that requires the cluster to
	// have an authorizer: Start fails without one, and a cluster that
	// later answers SECURITY_DISABLED gets every group request denied.
	AuthorizationClusterACLs AuthorizationMode = "cluster-acls"
)

// ParseAuthorizationMode checks a mode's name; "" is off.
func ParseAuthorizationMode(s string) (AuthorizationMode, error) {
	switch m := AuthorizationMode(s); m {
	case "", AuthorizationOff:
		return AuthorizationOff, nil
	case AuthorizationAuto, AuthorizationClusterACLs:
		return m, nil
	}
	return "", fmt.Errorf("group authorization %q: want auto, cluster-acls or off", s)
}

// AuthorizationConfig configures the authorization of group requests.
type AuthorizationConfig struct {
	// Mode is off (""), auto or cluster-acls.
	Mode AuthorizationMode
	// SuperUsers are the brokers' super.users ("User:admin"), which
	// DescribeAcls cannot show.
	SuperUsers []string
	// AllowEveryoneIfNoACL is the brokers'
	// allow.everyone.if.no.acl.found.
	AllowEveryoneIfNoACL bool
	// AnonymousCluster says kproxy's own client reaches the cluster
	// without SASL and without a client certificate
	// (authz.Set.AnonymousCluster: an empty ACL list then allows
	// everything, as the cluster would).
	AnonymousCluster bool
	// CacheTTL is how long a read of the ACLs is used: a revoked or
	// added ACL takes effect at most this long later. Default 10s.
	CacheTTL time.Duration
}

// ParseSuperUsers splits the brokers' super.users syntax,
// "User:a;User:b".
func ParseSuperUsers(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ";") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if kind, name, ok := strings.Cut(p, ":"); !ok || kind == "" || name == "" {
			return nil, fmt.Errorf("super user %q: want PrincipalType:name, such as User:admin", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// wireAuthz puts group authorization in front of w's coordinator (the
// engine, or the fleet's router) when cfg asks for it. kproxy's own
// principal needs DESCRIBE on the CLUSTER resource to read the ACLs.
func wireAuthz(ctx context.Context, w *Server, cfg Config) error {
	ac := cfg.Authorization
	mode, err := ParseAuthorizationMode(string(ac.Mode))
	if err != nil {
		return err
	}
	if mode == AuthorizationOff || w.coordinator == nil {
		if w.coordinator != nil {
			w.log.Info("group authorization off: every group request kproxy serves is allowed")
		}
		return nil
	}
	ttl := ac.CacheTTL
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	base := authz.Set{AllowIfNoACL: ac.AllowEveryoneIfNoACL, AnonymousCluster: ac.AnonymousCluster, SuperUsers: map[string]bool{}}
	for _, u := range ac.SuperUsers {
		base.SuperUsers[u] = true
	}
	cache := authz.NewCache(w.upstream, base, ttl)
	// The first read, which also fills the cache.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	set, ferr := cache.Set(fctx)
	cancel()
	noAuthorizer := ferr == nil && set.NoAuthorizer
	log := w.log.With("component", "authz")
	switch {
	case noAuthorizer && mode == AuthorizationClusterACLs:
		return errors.New("group authorization cluster-acls: the cluster has no authorizer (DescribeAcls answered SECURITY_DISABLED); use --group-authorization auto or off")
	case noAuthorizer:
		log.Info("group authorization auto: the cluster has no authorizer, so every group request is allowed, as its brokers allow it")
	case errors.Is(ferr, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("group authorization %s: kproxy's own principal may not read the cluster's ACLs (it needs DESCRIBE on the CLUSTER resource), or use --group-authorization off: %w", mode, ferr)
	case ferr != nil:
		log.Warn("group authorization: the cluster's ACLs cannot be read yet; group requests are answered COORDINATOR_NOT_AVAILABLE (retriable) until they can", "err", ferr)
	case len(set.ACLs) == 0 && ac.AnonymousCluster:
		log.Info("group authorization on: the cluster has no ACLs and kproxy reaches it as User:ANONYMOUS, so every group request is allowed until an ACL exists, as the cluster allows it",
			"mode", mode, "acl_cache_ttl", ttl)
	case len(set.ACLs) == 0 && !ac.AllowEveryoneIfNoACL:
		log.Warn("group authorization on, but the cluster has no ACLs: only super users' group requests are allowed (a cluster without an authorizer would have answered SECURITY_DISABLED; an in-memory kfake cluster without ACLs needs --group-authorization off)",
			"mode", mode, "super_users", ac.SuperUsers, "acl_cache_ttl", ttl)
	default:
		log.Info("group authorization on: group requests are authorized with the cluster's ACLs",
			"mode", mode, "acls", len(set.ACLs), "super_users", ac.SuperUsers, "allow_everyone_if_no_acl_found", ac.AllowEveryoneIfNoACL, "acl_cache_ttl", ttl)
	}
	names := kafkastore.New(w.upstream)
	acfg := proxy.AuthorizerConfig{
		ACLs:              cache,
		RequireAuthorizer: mode == AuthorizationClusterACLs,
		TopicNames:        names.TopicNames,
		Logger:            log,
	}
	w.coordinator = proxy.NewAuthorizer(w.coordinator, acfg)
	if w.groupConfigService != nil {
		// GROUP configs kproxy keeps: DESCRIBE_CONFIGS or ALTER_CONFIGS
		// on the group, as Kafka 4 checks them (authz/configs.go).
		w.groupConfigService = proxy.NewAuthorizer(w.groupConfigService, acfg)
	}
	if w.shares != nil {
		// The share service fetches records with kproxy's own client:
		// each client's ShareFetch is authorized first, as a broker
		// does (READ on the group and on each topic), so that no record
		// reaches a client the brokers would refuse it to.
		w.shareService = proxy.AuthorizedShares(w.shares, acfg)
	}
	// Refresh ahead of expiry so that requests rarely wait for
	// DescribeAcls: one that does holds up the requests behind it on its
	// connection (the session's reader decides).
	w.runUntilClose(cache.RefreshAhead)
	return nil
}
