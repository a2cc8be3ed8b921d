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
	"net"
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
	return serverHandshake(s.ctx, c, src.ServerConfig(), src.cfg.HandshakeTimeout, s.log, "peer",
		"plaintext sent to a TLS peer listener (the other kproxy needs --peer-tls-cert, --peer-tls-key and --peer-tls-ca)")
}
