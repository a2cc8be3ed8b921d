package proxy

// The client's identity, learned from its own connection (issue 9; the
// design is package authz's comment).
//
// SASL passes through byte for byte. The session reads, without
// changing them, the SaslHandshake request (the mechanism), the client's
// first SaslAuthenticate bytes (the name it claims) and the broker's
// SaslAuthenticate responses (its verdict): once the broker has accepted
// the exchange, the claimed name is the principal. Neither the bytes nor
// anything derived from them but the user name is kept, logged or
// counted: PLAIN's carry the password, OAUTHBEARER's a token.
//
// The exchange ends, accepted, with a SaslAuthenticate response of error
// 0 at the mechanism's last step: PLAIN's first response, SCRAM's second
// (the first carries the server-first message), OAUTHBEARER's first when
// it carries no bytes (a failed token is answered with an error
// challenge first, RFC 7628 section 3.2.2). GSSAPI (and any other
// mechanism) counts as accepted at a response of error 0 with no bytes,
// the last of its exchange; its principal is the broker's mapping of a
// Kerberos name, which kproxy cannot compute, so it stays unknown and
// group requests are denied (authz). A failed exchange is answered with
// an error, after which the broker closes the connection.
//
// Re-authentication (KIP-368) runs a new exchange on the same
// connection; the principal stays until it ends (the broker requires the
// same principal again).
//
// On an mTLS listener the principal is that of the verified client
// certificate (authz.CertPrincipal) until a SASL exchange replaces it.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/authz"
	"github.com/kproxy/kproxy/codec"
)

// saslState tracks one session's SASL exchange. The reader records
// requests, the writer responses; mu guards every field.
type saslState struct {
	mu        sync.Mutex
	mechanism string // from the last SaslHandshake request
	steps     int    // SaslAuthenticate requests in the current exchange
	responses int    // SaslAuthenticate responses in the current exchange
	claimed   string // user the client claims in its first auth bytes; "" unknown
	done      bool   // a SASL exchange was accepted by the broker
	principal string // "User:<claimed>" of the accepted exchange; "" unknown
}

// clientFor is the identity of a new connection: its peer address and,
// on an mTLS listener, the principal of its verified certificate.
func clientFor(c net.Conn, host string) Client {
	cl := Client{Host: host}
	if tc, ok := c.(*tls.Conn); ok {
		if chains := tc.ConnectionState().VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
			cl.Principal, cl.Authenticated = authz.CertPrincipal(chains[0][0]), true
		}
	}
	return cl
}

// observeSASLRequest records what a SaslHandshake or SaslAuthenticate
// request says about the client's identity. body is the start of the
// request after its header; when the request is larger than what is
// buffered (an unusually large token) the claimed name stays unknown.
func (s *session) observeSASLRequest(h codec.RequestHeader, head []byte, total int) {
	if h.Key != codec.KeySaslHandshake && h.Key != codec.KeySaslAuthenticate {
		return
	}
	if len(head) < total {
		s.sasl.mu.Lock()
		if h.Key == codec.KeySaslAuthenticate {
			s.sasl.steps++
		}
		s.sasl.mu.Unlock()
		return
	}
	body := head[4+h.Len : total]
	s.sasl.mu.Lock()
	defer s.sasl.mu.Unlock()
	switch h.Key {
	case codec.KeySaslHandshake:
		req := kmsg.NewPtrSASLHandshakeRequest()
		req.SetVersion(h.Version)
		mech := ""
		if err := req.ReadFrom(body); err == nil {
			mech = req.Mechanism
		}
		s.sasl.mechanism, s.sasl.steps, s.sasl.responses, s.sasl.claimed = mech, 0, 0, ""
	case codec.KeySaslAuthenticate:
		s.sasl.steps++
		if s.sasl.steps != 1 {
			return
		}
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.SetVersion(h.Version)
		if err := req.ReadFrom(body); err != nil {
			return
		}
		// Only the name is kept; the bytes alias the read buffer and
		// are never copied.
		switch s.sasl.mechanism {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
			s.sasl.claimed, _ = authz.SASLUser(s.sasl.mechanism, req.SASLAuthBytes)
		case "OAUTHBEARER":
			s.sasl.claimed, _ = authz.OAuthBearerSubject(req.SASLAuthBytes)
		}
	}
}

// observeSASLResponse reads the broker's verdict in a SaslAuthenticate
// response body; the response itself goes to the client unchanged.
func (s *session) observeSASLResponse(key, version int16, body []byte) {
	if key != codec.KeySaslAuthenticate {
		return
	}
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	resp.SetVersion(version)
	if err := resp.ReadFrom(body); err != nil {
		return
	}
	s.sasl.mu.Lock()
	defer s.sasl.mu.Unlock()
	s.sasl.responses++
	if resp.ErrorCode != 0 {
		return // the broker closes the connection
	}
	final := false
	switch s.sasl.mechanism {
	case "PLAIN":
		final = s.sasl.responses == 1
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		final = s.sasl.responses == 2
	default: // OAUTHBEARER, GSSAPI, others
		final = len(resp.SASLAuthBytes) == 0
	}
	if !final {
		return
	}
	s.sasl.done = true
	s.sasl.principal = ""
	if s.sasl.claimed != "" {
		s.sasl.principal = "User:" + s.sasl.claimed
	}
	s.log.Debug("client authenticated", "mechanism", s.sasl.mechanism, "principal", s.sasl.principal)
}

// errUnauthenticated closes a connection that sends a request kproxy
// serves itself before completing SASL when the cluster requires it.
var errUnauthenticated = errors.New("unauthenticated connection")

// authGate runs before kproxy serves a request itself (a group API,
// FindCoordinator): with Config.RequireSASL, a session that has not
// completed SASL is closed, as a broker closes it; otherwise the
// session's client identity is brought up to date for the coordinator.
func (s *session) authGate(h codec.RequestHeader) error {
	s.sasl.mu.Lock()
	done, principal := s.sasl.done, s.sasl.principal
	s.sasl.mu.Unlock()
	if s.p.cfg.RequireSASL && !done {
		s.p.metrics.refused(refusedUnauthenticated)
		return fmt.Errorf("%w: %s before completing SASL authentication; the cluster requires SASL (kproxy's own client uses it), and a broker accepts only ApiVersions, SaslHandshake and SaslAuthenticate before authentication",
			errUnauthenticated, kmsg.NameForKey(h.Key))
	}
	if done {
		s.rc.Principal, s.rc.Authenticated = principal, true
	}
	return nil
}

// findCoordinatorCode is the error a group key of FindCoordinator gets
// from the coordinator's authorizer, 0 without one.
func (s *session) findCoordinatorCode(key string) int16 {
	a, ok := s.p.cfg.Coordinator.(FindCoordinatorAuthorizer)
	if !ok {
		return 0
	}
	return a.AuthorizeFindCoordinator(s.rc, key)
}
