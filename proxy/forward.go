package proxy

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// Per-group forwarding (docs/anchors.md). A group whose members the
// cluster's own coordinator serves (an application still partly direct,
// being moved behind kproxy) is not kproxy's: FindCoordinator for it is
// answered with kproxy's listener for the cluster's coordinator broker,
// and its group requests arriving on that listener travel upstream on
// the client's own connection, unchanged, so the broker authorizes them
// as the client and the members behind kproxy and the direct ones form
// one group.

// GroupForwarder decides which groups the cluster's coordinator serves.
// It must be safe for concurrent use.
type GroupForwarder interface {
	// Forwarded reports whether requests for group go to the cluster's
	// coordinator. It is called for every group request and must be
	// cheap (a map lookup) and must not block.
	Forwarded(group string) bool
	// Lookup decides for group, asking the cluster if it must, and
	// returns the node id of the cluster's coordinator of a forwarded
	// group. It may block (it runs off the session's reader).
	Lookup(ctx context.Context, group string) (node int32, forward bool, err error)
}

// lookupTimeout bounds the lookups of one FindCoordinator: the answer
// holds the connection's later answers in their order meanwhile.
const lookupTimeout = 2 * time.Second

// forwardedGroup returns the single group req is about when the
// forwarder forwards it; "" otherwise (multi-group requests are served
// by kproxy, which answers them for the groups it holds).
func forwardedGroup(fw GroupForwarder, req kmsg.Request) string {
	var g string
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		g = r.Group
	case *kmsg.SyncGroupRequest:
		g = r.Group
	case *kmsg.HeartbeatRequest:
		g = r.Group
	case *kmsg.LeaveGroupRequest:
		g = r.Group
	case *kmsg.OffsetCommitRequest:
		g = r.Group
	case *kmsg.TxnOffsetCommitRequest:
		g = r.Group
	case *kmsg.OffsetDeleteRequest:
		g = r.Group
	case *kmsg.ConsumerGroupHeartbeatRequest:
		g = r.Group
	case *kmsg.OffsetFetchRequest:
		if r.Version < 8 {
			g = r.Group
		} else if len(r.Groups) == 1 {
			g = r.Groups[0].Group
		}
	case *kmsg.DescribeGroupsRequest:
		if len(r.Groups) == 1 {
			g = r.Groups[0]
		}
	case *kmsg.ConsumerGroupDescribeRequest:
		if len(r.Groups) == 1 {
			g = r.Groups[0]
		}
	}
	if g == "" || !fw.Forwarded(g) {
		return ""
	}
	return g
}

// queueFindCoordinator answers a FindCoordinator for groups: kproxy's own
// listener for the groups kproxy serves, kproxy's listener for the
// cluster's coordinator broker for forwarded ones. The forwarder is
// asked off the reader; the answer keeps its place in the queue.
func (s *session) queueFindCoordinator(h codec.RequestHeader, start int64, req *kmsg.FindCoordinatorRequest) error {
	fw := s.p.cfg.Forwarder
	if fw == nil {
		return s.queueLocal(h, start, s.findCoordinator(req))
	}
	r := getReply()
	if err := s.push(slot{route: codec.Local, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, reply: r}); err != nil {
		return err
	}
	go func() {
		resp := s.findCoordinator(req)
		ctx, cancel := context.WithTimeout(s.p.ctx, lookupTimeout)
		defer cancel()
		set := func(key string, nodeID *int32, host *string, port *int32, code *int16) {
			if *code != 0 {
				return // denied, or no listener: as kproxy answered
			}
			node, forward, err := fw.Lookup(ctx, key)
			if err != nil {
				// The cluster cannot say now (a broker down): kproxy
				// answers for itself; the owner's load checks again
				// before it serves the group.
				s.p.log.Debug("forwarding: lookup failed", "group", key, "err", err)
				return
			}
			if !forward {
				return
			}
			h, p, ok := s.p.brokerListener(node)
			if !ok {
				*nodeID, *host, *port, *code = -1, "", -1, kerr.CoordinatorNotAvailable.Code
				return
			}
			*nodeID, *host, *port = node, h, p
		}
		if req.Version < 4 {
			set(req.CoordinatorKey, &resp.NodeID, &resp.Host, &resp.Port, &resp.ErrorCode)
		} else {
			for i := range resp.Coordinators {
				c := &resp.Coordinators[i]
				set(c.Key, &c.NodeID, &c.Host, &c.Port, &c.ErrorCode)
			}
		}
		r.deliver(resp)
	}()
	return nil
}

// brokerListener returns the advertised address of kproxy's listener for
// upstream broker node, if it has one.
func (p *Proxy) brokerListener(node int32) (string, int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.listeners[node]; node >= 0 && l != nil {
		return p.cfg.AdvertiseHost, l.port, true
	}
	return "", 0, false
}
