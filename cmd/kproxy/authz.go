package main

// Group authorization settings (package authz, internal/kproxy's
// AuthorizationConfig): the group requests kproxy serves itself are
// authorized for the client's own principal with the cluster's ACLs.

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/internal/kproxy"
)

// authorizationConfig is the config file's `group_authorization`
// section.
type authorizationConfig struct {
	// Mode: auto (default), cluster-acls or off (--group-authorization).
	Mode string `yaml:"mode"`
	// SuperUsers is the brokers' super.users, "User:a;User:b"
	// (--super-users).
	SuperUsers string `yaml:"super_users"`
	// AllowEveryoneIfNoACLFound is the brokers'
	// allow.everyone.if.no.acl.found (--allow-everyone-if-no-acl-found).
	AllowEveryoneIfNoACLFound bool `yaml:"allow_everyone_if_no_acl_found"`
	// ACLCacheTTL: a changed ACL takes effect at most this long later
	// (--acl-cache-ttl).
	ACLCacheTTL time.Duration `yaml:"acl_cache_ttl"`
}

func defaultAuthorization() authorizationConfig {
	return authorizationConfig{Mode: string(kproxy.AuthorizationAuto), ACLCacheTTL: 10 * time.Second}
}

// authzFlags are serve's group authorization flags.
type authzFlags struct {
	c   authorizationConfig
	set bool // bound (serve only)
}

func (f *authzFlags) bind(fs *pflag.FlagSet) {
	f.set = true
	d := defaultAuthorization()
	fs.StringVar(&f.c.Mode, "group-authorization", d.Mode, "authorize the group requests kproxy serves for each client's own principal: auto (the cluster's ACLs via DescribeAcls; everything allowed if the cluster has no authorizer), cluster-acls (as auto, but the cluster must have an authorizer) or off")
	fs.StringVar(&f.c.SuperUsers, "super-users", "", "the brokers' super.users, which DescribeAcls cannot show: \"User:a;User:b\"")
	fs.BoolVar(&f.c.AllowEveryoneIfNoACLFound, "allow-everyone-if-no-acl-found", false, "the brokers' allow.everyone.if.no.acl.found")
	fs.DurationVar(&f.c.ACLCacheTTL, "acl-cache-ttl", d.ACLCacheTTL, "how long a read of the cluster's ACLs is used: a revoked ACL stops being honoured at most this long later")
}

func (f *authzFlags) apply(fs *pflag.FlagSet, c *fileConfig) {
	if !f.set {
		return
	}
	set := func(name string, apply func()) {
		if fs.Changed(name) {
			apply()
		}
	}
	set("group-authorization", func() { c.Authorization.Mode = f.c.Mode })
	set("super-users", func() { c.Authorization.SuperUsers = f.c.SuperUsers })
	set("allow-everyone-if-no-acl-found", func() { c.Authorization.AllowEveryoneIfNoACLFound = f.c.AllowEveryoneIfNoACLFound })
	set("acl-cache-ttl", func() { c.Authorization.ACLCacheTTL = f.c.ACLCacheTTL })
}

// validateAuthorization reports every problem of the section.
func (c *fileConfig) validateAuthorization() []error {
	var errs []error
	a := c.Authorization
	if _, err := kproxy.ParseAuthorizationMode(a.Mode); err != nil {
		errs = append(errs, err)
	}
	if _, err := kproxy.ParseSuperUsers(a.SuperUsers); err != nil {
		errs = append(errs, fmt.Errorf("group_authorization.super_users: %w", err))
	}
	if a.ACLCacheTTL < 0 {
		errs = append(errs, errors.New("group_authorization.acl_cache_ttl must be >= 0"))
	}
	return errs
}

// authorizationFor is the assembly's authorization configuration.
func authorizationFor(c fileConfig) kproxy.AuthorizationConfig {
	mode, _ := kproxy.ParseAuthorizationMode(c.Authorization.Mode)
	users, _ := kproxy.ParseSuperUsers(c.Authorization.SuperUsers)
	return kproxy.AuthorizationConfig{
		Mode:                 mode,
		SuperUsers:           users,
		AllowEveryoneIfNoACL: c.Authorization.AllowEveryoneIfNoACLFound,
		// Without SASL or a client certificate kproxy, like every
		// client of that listener, is User:ANONYMOUS to the cluster.
		AnonymousCluster: c.UpstreamSASL.Mechanism == "" && c.UpstreamTLS.Cert == "",
		CacheTTL:         c.Authorization.ACLCacheTTL,
	}
}
