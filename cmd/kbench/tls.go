package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// pathTLS is the path through kproxy's TLS listener (--tls).
const pathTLS = "proxy-tls"

// extraPath is a measured path beyond direct and proxy.
type extraPath struct {
	name string
	addr string
	m    meter
}

// extraPaths are the paths and the children behind them; stop stops the
// children.
type extraPaths struct {
	paths    []extraPath
	children []*child
	stops    []func() // of the other processes behind paths
}

func (e *extraPaths) stop() {
	for _, stop := range e.stops {
		stop()
	}
	for _, c := range e.children {
		if err := c.stop(); err != nil {
			slog.Warn("stopping kproxy", "err", err)
		}
	}
}

// startExtraPaths starts, with --tls, a second kproxy child with a TLS
// listener in front of broker (pinned like the first), and returns its
// path.
func startExtraPaths(ctx context.Context, o options, bin, broker, tmp string) (*extraPaths, error) {
	e := &extraPaths{}
	if err := startMorePaths(ctx, o, e, broker, tmp); err != nil {
		e.stop()
		return nil, err
	}
	if !o.tls {
		return e, nil
	}
	certFile, keyFile, clientCfg, err := selfSignedCert(tmp)
	if err != nil {
		e.stop()
		return nil, err
	}
	cc := childConfigFor(o, "--tls-cert", certFile, "--tls-key", keyFile)
	cc.env = withoutProfile(cc.env) // one profile: the plaintext child's
	ch, err := startChild(ctx, bin, broker, tmp, o.verbose, cc)
	if err != nil {
		e.stop()
		return nil, fmt.Errorf("kproxy with TLS: %w", err)
	}
	e.children = append(e.children, ch)
	e.paths = append(e.paths, extraPath{name: pathTLS, addr: ch.addr, m: meter{cpu: ch.cpu, tls: clientCfg, repin: ch.repin, pid: ch.cmd.Process.Pid}})
	return e, nil
}

func withoutProfile(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KPROXY_CPUPROFILE=") {
			out = append(out, kv)
		}
	}
	return out
}

// clientOpts adds the path's TLS dialer or redirection, if any, to opts.
func (m meter) clientOpts(opts ...kgo.Opt) []kgo.Opt {
	if m.tls != nil {
		opts = append(opts, kgo.DialTLSConfig(m.tls.Clone()))
	}
	if m.redirect != nil {
		opts = append(opts, redirector(m.redirect[0], m.redirect[1]))
	}
	return opts
}

// selfSignedCert writes a fresh ECDSA P-256 certificate for 127.0.0.1
// and localhost into dir and returns its files and a client
// configuration that trusts it alone.
func selfSignedCert(dir string) (certFile, keyFile string, client *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, fmt.Errorf("TLS key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "kbench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, fmt.Errorf("TLS certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, fmt.Errorf("TLS key: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, "kbench-cert.pem"), filepath.Join(dir, "kbench-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", nil, fmt.Errorf("TLS certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", nil, fmt.Errorf("TLS key: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", nil, fmt.Errorf("TLS certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
