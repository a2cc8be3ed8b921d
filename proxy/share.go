package proxy

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// ShareService serves ShareFetch and ShareAcknowledge (KIP-932) for the
// share groups kproxy serves itself (package shares). Its methods must
// not block the caller: reply is called exactly once, from any
// goroutine, possibly after MaxWaitMs.
type ShareService interface {
	ShareFetch(c ShareConn, req *kmsg.ShareFetchRequest, reply func(kmsg.Response))
	ShareAcknowledge(c ShareConn, req *kmsg.ShareAcknowledgeRequest, reply func(kmsg.Response))
	// Closed is called once when a connection that sent share requests
	// closes: its share sessions end and their records are released,
	// as when Kafka's broker loses a share consumer's connection.
	Closed(conn uint64)
}

// ShareConn is the connection a share request arrived on.
type ShareConn struct {
	Client
	Conn uint64 // the session's id, unique in the process
	Node int32  // the broker the listener stands for; -1 for bootstrap
}

// ShareConnOf is the connection c describes.
func ShareConnOf(c Client) ShareConn { return ShareConn{Client: c, Conn: c.Conn, Node: c.Node} }

// AuthorizedShares runs a ShareService's requests through an
// Authorizer (NewAuthorizer): ShareFetch and ShareAcknowledge are
// authorized for the connection's principal as a broker authorizes them
// (READ on the group, READ on each topic) before the service sees them.
func AuthorizedShares(svc ShareService, cfg AuthorizerConfig) ShareService {
	return &authorizedShares{svc: svc, auth: NewAuthorizer(shareCoordinator{svc}, cfg)}
}

type authorizedShares struct {
	svc  ShareService
	auth *Authorizer
}

func (a *authorizedShares) ShareFetch(c ShareConn, req *kmsg.ShareFetchRequest, reply func(kmsg.Response)) {
	a.auth.Handle(c.Client, req, reply)
}

func (a *authorizedShares) ShareAcknowledge(c ShareConn, req *kmsg.ShareAcknowledgeRequest, reply func(kmsg.Response)) {
	a.auth.Handle(c.Client, req, reply)
}

func (a *authorizedShares) Closed(conn uint64) { a.svc.Closed(conn) }

// shareCoordinator is a ShareService as the Coordinator an Authorizer
// wraps.
type shareCoordinator struct{ svc ShareService }

func (s shareCoordinator) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	switch r := req.(type) {
	case *kmsg.ShareFetchRequest:
		s.svc.ShareFetch(ShareConnOf(c), r, reply)
	case *kmsg.ShareAcknowledgeRequest:
		s.svc.ShareAcknowledge(ShareConnOf(c), r, reply)
	default:
		reply(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
	}
}

// routeShare serves a share-group request when kproxy serves share
// groups: the membership APIs go to the coordinator, the data APIs to
// the share service.
func (s *session) routeShare(h codec.RequestHeader, start int64, total int) error {
	if !codec.ServedShareVersion(h.Key, h.Version) {
		return fmt.Errorf("%w: %s v%d: not a version kproxy serves share groups at", codec.ErrBadVersion, kmsg.NameForKey(h.Key), h.Version)
	}
	req, _, err := s.readLocal(h, total)
	if err != nil {
		return err
	}
	switch r := req.(type) {
	case *kmsg.ShareFetchRequest:
		return s.queueShare(h, start, func(c ShareConn, reply func(kmsg.Response)) { s.p.cfg.Shares.ShareFetch(c, r, reply) })
	case *kmsg.ShareAcknowledgeRequest:
		return s.queueShare(h, start, func(c ShareConn, reply func(kmsg.Response)) { s.p.cfg.Shares.ShareAcknowledge(c, r, reply) })
	}
	if s.p.cfg.Coordinator == nil {
		return fmt.Errorf("%s: share groups are served but no coordinator is configured", kmsg.NameForKey(h.Key))
	}
	return s.queueCoordinator(h, start, req)
}

// queueShare queues the place of a share data request and hands it to
// the share service.
func (s *session) queueShare(h codec.RequestHeader, start int64, serve func(ShareConn, func(kmsg.Response))) error {
	r := getReply()
	if err := s.push(slot{route: codec.Local, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, reply: r}); err != nil {
		return err
	}
	s.usedShares.Store(true)
	serve(ShareConn{Client: s.rc, Conn: s.id, Node: s.node}, r.deliver)
	return nil
}

// sharesClosed tells the share service that this connection is gone.
func (s *session) sharesClosed() {
	if s.usedShares.Load() {
		s.p.cfg.Shares.Closed(s.id)
	}
}
