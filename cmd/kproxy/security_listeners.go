package main

// TLS on kproxy's own listeners besides the client ones: the peer
// listener of the fleet (mutual TLS between kproxies) and the admin
// server (HTTPS, optionally requiring client certificates).
//
// Peer: every kproxy of the fleet gets --peer-tls-cert, --peer-tls-key
// and --peer-tls-ca. The peer listener then requires a client
// certificate chaining to the CA, and a relaying kproxy presents its own
// and verifies the owner's certificate against the same CA and against
// the owner's advertised peer host (or --peer-tls-server-name). A kproxy
// without a certificate from that CA can neither relay to this one nor
// be relayed to.
//
// Admin: --admin-tls-cert and --admin-tls-key make the admin server
// HTTPS. --admin-tls-client-ca then requires, on every request but
// /healthz and /readyz (which orchestrators probe without credentials),
// a client certificate chaining to that CA; with --admin-token-file too,
// both are required.
//
// All of these files are re-read when they change on disk (proxy's
// TLSSource), and --tls-min-version applies to them as well.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/proxy"
)

// peerTLSConfig is the config file's `peer_tls` section.
type peerTLSConfig struct {
	Cert       string `yaml:"cert"`        // --peer-tls-cert
	Key        string `yaml:"key"`         // --peer-tls-key
	CA         string `yaml:"ca"`          // --peer-tls-ca: the fleet's CA, for both directions
	ServerName string `yaml:"server_name"` // --peer-tls-server-name
}

// adminTLSConfig is the config file's `admin_tls` section.
type adminTLSConfig struct {
	Cert     string `yaml:"cert"`      // --admin-tls-cert
	Key      string `yaml:"key"`       // --admin-tls-key
	ClientCA string `yaml:"client_ca"` // --admin-tls-client-ca
}

// listenerSecurity is inlined in fileConfig: the sections above at the
// file's top level.
type listenerSecurity struct {
	PeerTLS  peerTLSConfig  `yaml:"peer_tls"`
	AdminTLS adminTLSConfig `yaml:"admin_tls"`
}

// listenerSecurityFlags are the flags of the sections above (serve and
// dev).
type listenerSecurityFlags struct {
	v listenerSecurity
}

func (f *listenerSecurityFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.v.PeerTLS.Cert, "peer-tls-cert", "", "certificate (PEM) of this kproxy on the fleet's peer wire (mutual TLS; needs --peer-tls-key and --peer-tls-ca)")
	fs.StringVar(&f.v.PeerTLS.Key, "peer-tls-key", "", "private key (PEM) of --peer-tls-cert")
	fs.StringVar(&f.v.PeerTLS.CA, "peer-tls-ca", "", "CA bundle (PEM) every kproxy's peer certificate must chain to")
	fs.StringVar(&f.v.PeerTLS.ServerName, "peer-tls-server-name", "", "name the other kproxies' peer certificates must carry (default: the host of their peer address)")
	fs.StringVar(&f.v.AdminTLS.Cert, "admin-tls-cert", "", "certificate (PEM) of the admin server, which then serves HTTPS")
	fs.StringVar(&f.v.AdminTLS.Key, "admin-tls-key", "", "private key (PEM) of --admin-tls-cert")
	fs.StringVar(&f.v.AdminTLS.ClientCA, "admin-tls-client-ca", "", "CA bundle (PEM): admin requests but /healthz and /readyz need a client certificate it signed")
}

// apply copies the flags given on the command line over c.
func (f *listenerSecurityFlags) apply(fs *pflag.FlagSet, c *fileConfig) {
	for name, apply := range map[string]func(){
		"peer-tls-cert":        func() { c.PeerTLS.Cert = f.v.PeerTLS.Cert },
		"peer-tls-key":         func() { c.PeerTLS.Key = f.v.PeerTLS.Key },
		"peer-tls-ca":          func() { c.PeerTLS.CA = f.v.PeerTLS.CA },
		"peer-tls-server-name": func() { c.PeerTLS.ServerName = f.v.PeerTLS.ServerName },
		"admin-tls-cert":       func() { c.AdminTLS.Cert = f.v.AdminTLS.Cert },
		"admin-tls-key":        func() { c.AdminTLS.Key = f.v.AdminTLS.Key },
		"admin-tls-client-ca":  func() { c.AdminTLS.ClientCA = f.v.AdminTLS.ClientCA },
	} {
		if fs.Changed(name) {
			apply()
		}
	}
}

// validateListenerSecurity reports every problem of the peer and admin
// TLS settings.
func (c *fileConfig) validateListenerSecurity() []error {
	var errs []error
	p := c.PeerTLS
	if p.Cert != "" || p.Key != "" || p.CA != "" {
		if p.Cert == "" || p.Key == "" || p.CA == "" {
			errs = append(errs, errors.New("peer_tls: --peer-tls-cert, --peer-tls-key and --peer-tls-ca go together (each kproxy verifies the other)"))
		}
		if c.Groups.Mode != "distributed" {
			errs = append(errs, fmt.Errorf("peer_tls: set with groups.mode %q; only distributed mode has a peer listener", c.Groups.Mode))
		}
	} else if p.ServerName != "" {
		errs = append(errs, errors.New("peer_tls: --peer-tls-server-name without --peer-tls-cert"))
	}
	a := c.AdminTLS
	if (a.Cert == "") != (a.Key == "") {
		errs = append(errs, errors.New("admin_tls: --admin-tls-cert and --admin-tls-key go together"))
	}
	if a.ClientCA != "" && a.Cert == "" {
		errs = append(errs, errors.New("admin_tls: --admin-tls-client-ca needs --admin-tls-cert and --admin-tls-key"))
	}
	if a.Cert != "" && c.AdminListen == "" {
		errs = append(errs, errors.New("admin_tls: set without --admin-listen"))
	}
	return errs
}

// listenerSecuritySources builds the peer and admin TLS sources; each is
// nil when not configured.
func listenerSecuritySources(c fileConfig, log *slog.Logger) (peer, admin *proxy.TLSSource, err error) {
	v, _ := tlsVersion(c.TLS.MinVersion)
	if p := c.PeerTLS; p.Cert != "" {
		peer, err = proxy.NewTLSSource(proxy.TLSConfig{
			CertFile: p.Cert, KeyFile: p.Key, ClientCAFile: p.CA, MinVersion: v,
		}, log.With("component", "peer_tls"))
		if err != nil {
			return nil, nil, fmt.Errorf("peer listener %w", err)
		}
	}
	if a := c.AdminTLS; a.Cert != "" {
		admin, err = proxy.NewTLSSource(proxy.TLSConfig{
			CertFile: a.Cert, KeyFile: a.Key, ClientCAFile: a.ClientCA, MinVersion: v,
			// The probes stay open: the handler asks for the
			// certificate (adminRequireCert).
			OptionalClientCert: true,
		}, log.With("component", "admin_tls"))
		if err != nil {
			return nil, nil, fmt.Errorf("admin listener %w", err)
		}
	}
	return peer, admin, nil
}

// adminRequireCert answers 401 to every admin request but the health and
// readiness probes that came without a client certificate verified
// against --admin-tls-client-ca (the handshake verified any certificate
// that was presented).
func adminRequireCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "unauthorized: this kproxy's admin server needs a client certificate (--admin-tls-client-ca)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminHandlerWrap is what wraps the admin handler: the client
// certificate check of --admin-tls-client-ca, then the bearer token of
// --admin-token-file (security.go), each when configured.
func adminHandlerWrap(c fileConfig, log *slog.Logger) (func(http.Handler) http.Handler, error) {
	tokenWrap, err := adminWrapper(c, log)
	if err != nil {
		return nil, err
	}
	if c.AdminTLS.ClientCA == "" {
		return tokenWrap, nil
	}
	return func(h http.Handler) http.Handler { return adminRequireCert(tokenWrap(h)) }, nil
}

// adminScheme is the admin server's URL scheme.
func adminScheme(c fileConfig) string {
	if c.AdminTLS.Cert != "" {
		return "https"
	}
	return "http"
}
