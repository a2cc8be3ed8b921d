package main

// Security settings: TLS on the client listeners, TLS and SASL for
// kproxy's own upstream client, and the admin server's bearer token.
//
// Secrets: the SASL password comes from the environment variable
// KPROXY_UPSTREAM_SASL_PASSWORD or from --upstream-sasl-password-file,
// never from a flag value (ps shows those) nor the config file. It is
// held in a secret value whose String, LogValue and JSON forms are
// "[redacted]", and only the SASL mechanism ever sees the bytes. The
// admin token is read from --admin-token-file and compared in constant
// time; neither is logged.

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kproxy/kproxy/proxy"
)

// passwordEnv names the environment variable holding the upstream SASL
// password.
const passwordEnv = "KPROXY_UPSTREAM_SASL_PASSWORD"

// listenerTLSConfig is the config file's `tls` section: TLS on every
// client listener.
type listenerTLSConfig struct {
	Cert             string        `yaml:"cert"`      // --tls-cert
	Key              string        `yaml:"key"`       // --tls-key
	ClientCA         string        `yaml:"client_ca"` // --tls-client-ca: require and verify client certificates
	MinVersion       string        `yaml:"min_version"`
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
}

// upstreamTLSConfig is the config file's `upstream_tls` section.
type upstreamTLSConfig struct {
	Enabled    bool   `yaml:"enabled"`     // --upstream-tls
	CA         string `yaml:"ca"`          // --upstream-tls-ca; empty: system roots
	Cert       string `yaml:"cert"`        // --upstream-tls-cert
	Key        string `yaml:"key"`         // --upstream-tls-key
	ServerName string `yaml:"server_name"` // --upstream-tls-server-name
}

// upstreamSASLConfig is the config file's `upstream_sasl` section. It
// has no password field on purpose.
type upstreamSASLConfig struct {
	Mechanism    string `yaml:"mechanism"`     // --upstream-sasl-mechanism
	Username     string `yaml:"username"`      // --upstream-sasl-username
	PasswordFile string `yaml:"password_file"` // --upstream-sasl-password-file
}

// securityFlags are the security flags of serve (upstream ones
// included) and dev (client side and admin only).
type securityFlags struct {
	tls          listenerTLSConfig
	upTLS        upstreamTLSConfig
	sasl         upstreamSASLConfig
	adminToken   string
	withUpstream bool
}

func (f *securityFlags) bind(fs *pflag.FlagSet, withUpstream bool) {
	f.withUpstream = withUpstream
	fs.StringVar(&f.tls.Cert, "tls-cert", "", "TLS certificate (PEM) of every client listener; reloaded when the file changes")
	fs.StringVar(&f.tls.Key, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&f.tls.ClientCA, "tls-client-ca", "", "CA bundle (PEM): require and verify client certificates (mTLS)")
	fs.StringVar(&f.tls.MinVersion, "tls-min-version", "1.2", "lowest TLS version clients may use: 1.2 or 1.3")
	fs.StringVar(&f.adminToken, "admin-token-file", "", "file holding a token the admin server requires as 'Authorization: Bearer TOKEN' (/healthz and /readyz stay open)")
	if !withUpstream {
		return
	}
	fs.BoolVar(&f.upTLS.Enabled, "upstream-tls", false, "connect to the brokers with TLS (kproxy's own client and every client's connection)")
	fs.StringVar(&f.upTLS.CA, "upstream-tls-ca", "", "CA bundle (PEM) the brokers' certificates must chain to (default: system roots)")
	fs.StringVar(&f.upTLS.Cert, "upstream-tls-cert", "", "client certificate (PEM) kproxy's own client presents to the brokers")
	fs.StringVar(&f.upTLS.Key, "upstream-tls-key", "", "private key (PEM) of --upstream-tls-cert")
	fs.StringVar(&f.upTLS.ServerName, "upstream-tls-server-name", "", "name the brokers' certificates must carry (default: each broker's host)")
	fs.StringVar(&f.sasl.Mechanism, "upstream-sasl-mechanism", "", "SASL for kproxy's own upstream client: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (clients' SASL passes through)")
	fs.StringVar(&f.sasl.Username, "upstream-sasl-username", "", "SASL user of kproxy's own upstream client")
	fs.StringVar(&f.sasl.PasswordFile, "upstream-sasl-password-file", "", "file holding the SASL password (else the environment variable "+passwordEnv+")")
}

// apply copies the flags given on the command line over c.
func (f *securityFlags) apply(fs *pflag.FlagSet, c *fileConfig) {
	set := func(name string, apply func()) {
		if fs.Changed(name) {
			apply()
		}
	}
	set("tls-cert", func() { c.TLS.Cert = f.tls.Cert })
	set("tls-key", func() { c.TLS.Key = f.tls.Key })
	set("tls-client-ca", func() { c.TLS.ClientCA = f.tls.ClientCA })
	set("tls-min-version", func() { c.TLS.MinVersion = f.tls.MinVersion })
	set("admin-token-file", func() { c.AdminTokenFile = f.adminToken })
	if !f.withUpstream {
		return
	}
	set("upstream-tls", func() { c.UpstreamTLS.Enabled = f.upTLS.Enabled })
	set("upstream-tls-ca", func() { c.UpstreamTLS.CA = f.upTLS.CA })
	set("upstream-tls-cert", func() { c.UpstreamTLS.Cert = f.upTLS.Cert })
	set("upstream-tls-key", func() { c.UpstreamTLS.Key = f.upTLS.Key })
	set("upstream-tls-server-name", func() { c.UpstreamTLS.ServerName = f.upTLS.ServerName })
	set("upstream-sasl-mechanism", func() { c.UpstreamSASL.Mechanism = f.sasl.Mechanism })
	set("upstream-sasl-username", func() { c.UpstreamSASL.Username = f.sasl.Username })
	set("upstream-sasl-password-file", func() { c.UpstreamSASL.PasswordFile = f.sasl.PasswordFile })
}

func tlsVersion(s string) (uint16, error) {
	switch s {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("tls.min_version %q: want 1.2 or 1.3", s)
}

// validateSecurity reports every problem of the security settings.
func (c *fileConfig) validateSecurity() []error {
	var errs []error
	t := c.TLS
	if (t.Cert == "") != (t.Key == "") {
		errs = append(errs, errors.New("tls: --tls-cert and --tls-key go together"))
	}
	if t.ClientCA != "" && t.Cert == "" {
		errs = append(errs, errors.New("tls: --tls-client-ca needs --tls-cert and --tls-key"))
	}
	if _, err := tlsVersion(t.MinVersion); err != nil {
		errs = append(errs, err)
	}
	if t.HandshakeTimeout < 0 {
		errs = append(errs, errors.New("tls.handshake_timeout must be >= 0"))
	}
	u := c.UpstreamTLS
	if (u.Cert == "") != (u.Key == "") {
		errs = append(errs, errors.New("upstream_tls: --upstream-tls-cert and --upstream-tls-key go together"))
	}
	if !u.Enabled && (u.CA != "" || u.Cert != "" || u.ServerName != "") {
		errs = append(errs, errors.New("upstream_tls: CA, certificate or server name given without --upstream-tls"))
	}
	s := c.UpstreamSASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.PasswordFile != "" {
			errs = append(errs, errors.New("upstream_sasl: a username or password file without --upstream-sasl-mechanism"))
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if s.Username == "" {
			errs = append(errs, errors.New("upstream_sasl: --upstream-sasl-username is required"))
		}
	default:
		errs = append(errs, fmt.Errorf("upstream_sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism))
	}
	return errs
}

// secret holds a password or token; every printed form is redacted.
type secret string

func (secret) String() string               { return "[redacted]" }
func (secret) GoString() string             { return "[redacted]" }
func (secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }
func (secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }
func (s secret) reveal() string             { return string(s) }
func (s secret) equal(token string) bool    { return constantTimeEqual(string(s), token) }

// constantTimeEqual compares the hashes, so neither the contents nor
// the length of the secret leak through timing.
func constantTimeEqual(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// readSecretFile reads a password or token, without its final newline.
func readSecretFile(path string) (secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return secret(v), nil
}

// upstreamPassword returns the SASL password: the password file, else
// the environment.
func upstreamPassword(s upstreamSASLConfig, getenv func(string) string) (secret, error) {
	if s.PasswordFile != "" {
		p, err := readSecretFile(s.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("upstream sasl password: %w", err)
		}
		return p, nil
	}
	if p := getenv(passwordEnv); p != "" {
		return secret(p), nil
	}
	return "", fmt.Errorf("upstream sasl: no password: set %s or --upstream-sasl-password-file", passwordEnv)
}

// upstreamSecurity is what kproxy needs to reach a cluster that
// requires TLS or SASL.
type upstreamSecurity struct {
	// clientOpts go to every kgo client kproxy makes of the cluster
	// (its own client, the proxy's discovery client).
	clientOpts []kgo.Opt
	// dataTLS is the TLS of each client's upstream connection; nil
	// without --upstream-tls. It carries no client certificate: a
	// client's connection authenticates as the client (SASL passes
	// through), not as kproxy.
	dataTLS *tls.Config
}

// buildUpstreamSecurity reads the upstream CA, certificate and password
// and builds the kgo options.
func buildUpstreamSecurity(c fileConfig, getenv func(string) string) (upstreamSecurity, error) {
	var us upstreamSecurity
	if u := c.UpstreamTLS; u.Enabled {
		base := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.ServerName}
		if u.CA != "" {
			pool, err := proxy.LoadCertPool(u.CA)
			if err != nil {
				return us, fmt.Errorf("upstream tls: %w", err)
			}
			base.RootCAs = pool
		}
		us.dataTLS = base.Clone()
		own := base.Clone()
		if u.Cert != "" {
			cert, err := tls.LoadX509KeyPair(u.Cert, u.Key)
			if err != nil {
				return us, fmt.Errorf("upstream tls: loading %s and %s: %w", u.Cert, u.Key, err)
			}
			own.Certificates = []tls.Certificate{cert}
		}
		us.clientOpts = append(us.clientOpts, kgo.DialTLSConfig(own))
	}
	if s := c.UpstreamSASL; s.Mechanism != "" {
		pass, err := upstreamPassword(s, getenv)
		if err != nil {
			return us, err
		}
		var m sasl.Mechanism
		switch s.Mechanism {
		case "PLAIN":
			m = plain.Auth{User: s.Username, Pass: pass.reveal()}.AsMechanism()
		case "SCRAM-SHA-256":
			m = scram.Auth{User: s.Username, Pass: pass.reveal()}.AsSha256Mechanism()
		case "SCRAM-SHA-512":
			m = scram.Auth{User: s.Username, Pass: pass.reveal()}.AsSha512Mechanism()
		}
		us.clientOpts = append(us.clientOpts, kgo.SASL(m))
	}
	return us, nil
}

// listenerTLS builds the client listeners' TLS source; nil without
// --tls-cert.
func listenerTLS(c fileConfig, log *slog.Logger) (*proxy.TLSSource, error) {
	if c.TLS.Cert == "" {
		return nil, nil
	}
	v, _ := tlsVersion(c.TLS.MinVersion)
	src, err := proxy.NewTLSSource(proxy.TLSConfig{
		CertFile:         c.TLS.Cert,
		KeyFile:          c.TLS.Key,
		ClientCAFile:     c.TLS.ClientCA,
		MinVersion:       v,
		HandshakeTimeout: c.TLS.HandshakeTimeout,
	}, log.With("component", "tls"))
	if err != nil {
		return nil, fmt.Errorf("client listener %w", err)
	}
	return src, nil
}

// adminAuth requires `Authorization: Bearer <token>` on every admin
// request but the health and readiness probes, which orchestrators call
// without credentials and which reveal nothing.
func adminAuth(token secret, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !token.equal(strings.TrimSpace(got)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kproxy"`)
			http.Error(w, "unauthorized: this kproxy's admin server needs 'Authorization: Bearer TOKEN' (--admin-token-file)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminWrapper returns what wraps the admin handler: the bearer token
// of --admin-token-file when one is configured, else nothing (with a
// warning when the admin server is reachable beyond loopback).
func adminWrapper(c fileConfig, log *slog.Logger) (func(http.Handler) http.Handler, error) {
	if c.AdminTokenFile == "" {
		if host, _, err := net.SplitHostPort(c.AdminListen); err == nil && c.AdminTLS.ClientCA == "" {
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				log.Warn("admin server listens beyond loopback without --admin-token-file or --admin-tls-client-ca: anyone who reaches it can read group state", "admin_listen", c.AdminListen)
			}
		}
		return func(h http.Handler) http.Handler { return h }, nil
	}
	tok, err := readSecretFile(c.AdminTokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	return func(h http.Handler) http.Handler { return adminAuth(tok, h) }, nil
}
