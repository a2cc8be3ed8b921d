package proxy

// Mutual TLS on the peer wire (peer.go, peer_server.go).
//
// With peer TLS, every kproxy of a fleet holds a certificate and key and
// the CA bundle of the fleet (one TLSSource whose ClientCAFile is that
// CA). The owner's PeerServer requires a client certificate chaining to
// the CA; the relaying side's dialer (PeerTLSDialer) presents its own
// certificate and verifies the owner's against the same CA, and the
// owner's name: PeerTLSDialer's serverName, else the host of the peer
// address the owner advertised. The files are re-read when they change
// (TLSSource): a new handshake uses the current certificate and CA;
// connections already open keep theirs.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
)

// PeerTLSDialer returns a Dialer for the peer wire over mutual TLS: it
// presents src's certificate and verifies the peer's against src's CA
// bundle (its ClientCAFile, required) and serverName, or the host of the
// address dialled when serverName is empty. The handshake is bounded by
// the dial's context.
func PeerTLSDialer(src *TLSSource, serverName string) (Dialer, error) {
	if src == nil || src.cfg.ClientCAFile == "" {
		return nil, errors.New("peer tls: a CA bundle is required (each kproxy verifies the other)")
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cur := src.Config()
		name := serverName
		if name == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("peer address %q: %w", addr, err)
			}
			name = host
		}
		d := tls.Dialer{Config: &tls.Config{
			MinVersion: src.cfg.MinVersion,
			// Always present the certificate, even one the owner's CA
			// list does not name: the owner then logs why it refuses.
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				return &cur.Certificates[0], nil
			},
			RootCAs:    cur.ClientCAs,
			ServerName: name,
		}}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("peer tls to %s: %w", addr, err)
		}
		return c, nil
	}, nil
}

// peerHandshake runs the server side of TLS on a peer connection,
// bounded by the handshake timeout and the server's closing. On failure
// it closes c and logs one line saying why.
func (s *PeerServer) peerHandshake(c net.Conn) (net.Conn, bool) {
	src := s.cfg.TLS
	ctx, cancel := context.WithTimeout(s.ctx, src.cfg.HandshakeTimeout)
	defer cancel()
	tc := tls.Server(c, src.ServerConfig())
	err := tc.HandshakeContext(ctx)
	if err == nil {
		return tc, true
	}
	c.Close()
	remote := c.RemoteAddr().String()
	var rec tls.RecordHeaderError
	switch {
	case s.ctx.Err() != nil:
		// Closing.
	case errors.As(err, &rec):
		s.log.Warn("closing peer connection", "remote", remote,
			"reason", "not a TLS handshake: plaintext sent to a TLS peer listener (the other kproxy needs --peer-tls-cert, --peer-tls-key and --peer-tls-ca)")
	case ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded):
		s.log.Warn("closing peer connection", "remote", remote,
			"reason", fmt.Sprintf("TLS handshake not complete within %v", src.cfg.HandshakeTimeout))
	case errors.Is(err, io.EOF):
		s.log.Debug("peer closed before its TLS handshake", "remote", remote)
	default:
		s.log.Warn("closing peer connection", "remote", remote, "reason", "TLS handshake failed: "+err.Error())
	}
	return nil, false
}
