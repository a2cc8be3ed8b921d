package proxy

// TLS on both sides of the data path.
//
// Client side: every listener (bootstrap and per broker) serves TLS when
// Config.TLS is set. The certificate, key and client CA are read from
// files and re-read when a file's content changes on disk (a digest of
// each, read at most once per TLSConfig.ReloadInterval on the handshake
// path: a key replaced by one of the same size within the file system's
// timestamp granularity has the same modification time and size), so a rotated certificate reaches every new
// connection without a restart while connected clients keep the session
// they negotiated. A reload that fails (a half-written pair, a key that
// does not match) keeps the previous material and logs once per change.
//
// Upstream side: with Config.UpstreamTLS set, each session's upstream
// connection is a TLS client connection; SASL on it is the client's own,
// passed through byte for byte as in plaintext.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// TLSConfig configures TLS on the client listeners.
type TLSConfig struct {
	// CertFile and KeyFile hold the listener's certificate chain and
	// private key (PEM). Both are required.
	CertFile, KeyFile string
	// ClientCAFile, when set, holds the CA bundle (PEM) client
	// certificates must chain to: clients must present one (mTLS).
	ClientCAFile string
	// OptionalClientCert, with ClientCAFile, lets clients connect
	// without a certificate (one that is presented must still chain to
	// the CA): the server then decides per request, as the admin server
	// does for everything but its health probes.
	OptionalClientCert bool
	// MinVersion is the lowest TLS version accepted; default TLS 1.2.
	MinVersion uint16
	// HandshakeTimeout drops a client that has not completed its
	// handshake this long after connecting; default 10s.
	HandshakeTimeout time.Duration
	// ReloadInterval is how often, at most, the files are checked for
	// changes (on the handshake path); default 2s.
	ReloadInterval time.Duration
}

func (c *TLSConfig) setDefaults() {
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.ReloadInterval <= 0 {
		c.ReloadInterval = 2 * time.Second
	}
}

// fileStamp identifies one version of a file on disk: the digest of its
// content (certificates and keys are a few KB).
type fileStamp [sha256.Size]byte

func stampOf(path string) (fileStamp, error) {
	if path == "" {
		return fileStamp{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fileStamp{}, err
	}
	return sha256.Sum256(b), nil
}

// TLSSource serves a listener's TLS configuration from files, reloading
// them when they change on disk. Safe for concurrent use.
type TLSSource struct {
	cfg TLSConfig    // immutable after NewTLSSource
	log *slog.Logger // immutable

	mu        sync.Mutex
	current   *tls.Config  // guarded by mu: served to new handshakes
	stamps    [3]fileStamp // guarded by mu: cert, key, CA as last loaded (or last failed)
	checked   time.Time    // guarded by mu: when the stamps were last compared
	loadedAt  time.Time    // guarded by mu: when current was built
	leafDER   []byte       // guarded by mu: the current leaf certificate (DER), to log changes
	lastError string       // guarded by mu: the last reload failure logged
}

// NewTLSSource loads the files of cfg once; an error here is a
// configuration error (later reload failures keep the loaded material).
func NewTLSSource(cfg TLSConfig, log *slog.Logger) (*TLSSource, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("tls: both a certificate and a key file are required")
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &TLSSource{cfg: cfg, log: log}
	stamps, err := s.stamps3()
	if err != nil {
		return nil, err
	}
	conf, leaf, err := s.load()
	if err != nil {
		return nil, err
	}
	s.current, s.stamps, s.leafDER = conf, stamps, leaf
	s.checked, s.loadedAt = time.Now(), time.Now()
	return s, nil
}

func (s *TLSSource) stamps3() ([3]fileStamp, error) {
	var st [3]fileStamp
	for i, p := range []string{s.cfg.CertFile, s.cfg.KeyFile, s.cfg.ClientCAFile} {
		v, err := stampOf(p)
		if err != nil {
			return st, fmt.Errorf("tls: %w", err)
		}
		st[i] = v
	}
	return st, nil
}

// load reads the files and builds a server configuration.
func (s *TLSSource) load() (*tls.Config, []byte, error) {
	cert, err := tls.LoadX509KeyPair(s.cfg.CertFile, s.cfg.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: loading %s and %s: %w", s.cfg.CertFile, s.cfg.KeyFile, err)
	}
	conf := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   s.cfg.MinVersion,
	}
	if s.cfg.ClientCAFile != "" {
		pool, err := loadCertPool(s.cfg.ClientCAFile)
		if err != nil {
			return nil, nil, err
		}
		conf.ClientCAs = pool
		conf.ClientAuth = tls.RequireAndVerifyClientCert
		if s.cfg.OptionalClientCert {
			conf.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	return conf, cert.Certificate[0], nil
}

// loadCertPool reads a PEM bundle of CA certificates.
func loadCertPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: reading CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: no PEM certificate in %s", path)
	}
	return pool, nil
}

// LoadCertPool reads a PEM bundle of CA certificates (for cmd/kproxy's
// upstream configuration).
func LoadCertPool(path string) (*x509.CertPool, error) { return loadCertPool(path) }

// Config returns the configuration a new handshake uses, reloading the
// files first when they changed on disk.
func (s *TLSSource) Config() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.checked) < s.cfg.ReloadInterval {
		return s.current
	}
	s.checked = now
	stamps, err := s.stamps3()
	if err != nil {
		s.reloadFailed(err)
		return s.current
	}
	if stamps == s.stamps {
		return s.current
	}
	conf, leaf, err := s.load()
	if err != nil {
		// Keep the old material; try again when the files change
		// once more (a writer may be between the cert and the key).
		s.stamps = stamps
		s.reloadFailed(err)
		return s.current
	}
	s.stamps, s.current, s.loadedAt, s.lastError = stamps, conf, now, ""
	if !bytes.Equal(leaf, s.leafDER) {
		s.leafDER = leaf
		s.log.Info("tls certificate reloaded", "cert", s.cfg.CertFile, "subject", subjectOf(leaf))
	}
	return s.current
}

func (s *TLSSource) reloadFailed(err error) {
	if msg := err.Error(); msg != s.lastError {
		s.lastError = msg
		s.log.Warn("tls reload failed: keeping the previous certificate", "err", err)
	}
}

func subjectOf(der []byte) string {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return ""
	}
	return c.Subject.String()
}

// ServerConfig returns a tls.Config for a listener that asks the source
// for its configuration at every handshake.
func (s *TLSSource) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: s.cfg.MinVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.Config(), nil
		},
	}
}

// handshake runs the server side of TLS on c, bounded by the handshake
// timeout and by the proxy's shutdown. On failure it closes c and logs
// one line saying why.
func (p *Proxy) handshake(c net.Conn) (net.Conn, bool) {
	return serverHandshake(p.ctx, c, p.tlsServer, p.tlsSrc.cfg.HandshakeTimeout, p.log, "client",
		"plaintext sent to a TLS listener (the client needs security.protocol SSL or SASL_SSL)")
}

// serverHandshake is the server side of TLS on c for a listener of kind
// ("client", "peer"), bounded by timeout and by ctx (the listener's
// closing). On failure it closes c and logs one line saying why;
// plaintext says what a plaintext client got wrong.
func serverHandshake(ctx context.Context, c net.Conn, cfg *tls.Config, timeout time.Duration, log *slog.Logger, kind, plaintext string) (net.Conn, bool) {
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc := tls.Server(c, cfg)
	err := tc.HandshakeContext(hctx)
	if err == nil {
		return tc, true
	}
	c.Close()
	remote := c.RemoteAddr().String()
	var rec tls.RecordHeaderError
	switch {
	case ctx.Err() != nil:
		// Closing.
	case errors.As(err, &rec):
		log.Warn("closing "+kind+" connection", "remote", remote, "reason", "not a TLS handshake: "+plaintext)
	case hctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded):
		log.Warn("closing "+kind+" connection", "remote", remote,
			"reason", fmt.Sprintf("TLS handshake not complete within %v", timeout))
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		// A port check (TCP connect, close), or a client that went
		// away mid-handshake (a kgo client closing while it still
		// dials another broker resets that connection): nothing to
		// report.
		log.Debug(kind+" closed before its TLS handshake", "remote", remote, "err", err)
	default:
		log.Warn("closing "+kind+" connection", "remote", remote, "reason", "TLS handshake failed: "+err.Error())
	}
	return nil, false
}

// dialUpstreamWithin connects to a broker for a session, over TLS when
// Config.UpstreamTLS is set, timeout bounding the dial and the TLS
// handshake each (sessions pass Config.DialTimeout, or a shorter one for
// an ApiVersions that may be answered from the cache). A TLS failure is
// a *upstreamTLSError: the broker is reachable, so its listener must
// stay open.
func (p *Proxy) dialUpstreamWithin(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	var err error
	if p.cfg.Dial != nil {
		ctx, cancel := context.WithTimeout(p.ctx, timeout)
		c, err = p.cfg.Dial(ctx, "tcp", addr)
		cancel()
	} else {
		c, err = net.DialTimeout("tcp", addr, timeout)
	}
	if err != nil || p.cfg.UpstreamTLS == nil {
		return c, err
	}
	conf := p.cfg.UpstreamTLS.Clone()
	if conf.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		conf.ServerName = host
	}
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	tc := tls.Client(c, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, &upstreamTLSError{addr: addr, err: err}
	}
	return tc, nil
}

// upstreamTLSError says the TLS handshake with a broker failed.
type upstreamTLSError struct {
	addr string
	err  error
}

func (e *upstreamTLSError) Error() string {
	return fmt.Sprintf("TLS handshake with broker %s: %v", e.addr, e.err)
}
func (e *upstreamTLSError) Unwrap() error { return e.err }

// setLinger0 makes closing c reset the connection (see session.run);
// for a TLS connection it applies to the socket underneath.
func setLinger0(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
}

// copyBufs are the buffers of copies that cannot splice (TLS on either
// side).
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writerOnly hides a ReadFrom method so io.CopyBuffer uses the buffer.
type writerOnly struct{ io.Writer }

// readFrom moves lr's bytes to dst: by splice between two TCP sockets,
// through a pooled buffer otherwise. Like (*net.TCPConn).ReadFrom it
// returns a nil error at EOF.
func readFrom(dst net.Conn, lr *io.LimitedReader) (int64, error) {
	if tc, ok := dst.(*net.TCPConn); ok {
		if _, ok := lr.R.(*net.TCPConn); ok {
			return tc.ReadFrom(lr)
		}
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(writerOnly{dst}, lr, *buf)
}
