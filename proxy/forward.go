package proxy

import (
	"context"
	"encoding/binary"
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
	// returns the node id of the cluster's coordinator of group (-1 if
	// it does not know it) and whether the group is forwarded. It may
	// block (it runs off the session's reader).
	Lookup(ctx context.Context, group string) (node int32, forward bool, err error)
	// Claim records that a client asked for group as a group of kind
	// (codec.GroupKind: share or streams), which only the cluster's
	// coordinator serves, so that FindCoordinator for it names that
	// coordinator from now on. served reports that kproxy serves group
	// as a consumer group instead: the request is then answered as the
	// cluster answers a request of the wrong kind. It may block; ctx
	// bounds it.
	Claim(ctx context.Context, group, kind string) (served bool)
}

// lookupTimeout bounds the lookups of one FindCoordinator: the answer
// holds the connection's later answers in their order meanwhile.
const lookupTimeout = 2 * time.Second

// RequestForwarder is implemented by a GroupForwarder that decides per
// request for some groups: a group being handed back to the cluster's
// coordinator (docs/anchors.md) has members of kproxy's engine and
// members already in the cluster's group, told apart by member id.
type RequestForwarder interface {
	// ForwardRequest is called instead of Forwarded for every request
	// about one group, with the same constraints. It reports whether req
	// goes to the cluster's coordinator; rewrite says it changed req,
	// which then travels upstream re-encoded instead of as it came.
	ForwardRequest(group string, req kmsg.Request) (forward, rewrite bool)
}

// forwardedGroup returns the single group req is about when the
// forwarder forwards it; "" otherwise (multi-group requests are served
// by kproxy, which answers them for the groups it holds). rewrite says
// the forwarder changed req (RequestForwarder).
func forwardedGroup(fw GroupForwarder, req kmsg.Request) (group string, rewrite bool) {
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
	if g == "" {
		return "", false
	}
	if rf, ok := fw.(RequestForwarder); ok {
		forward, rewrite := rf.ForwardRequest(g, req)
		if !forward {
			return "", false
		}
		return g, rewrite
	}
	if !fw.Forwarded(g) {
		return "", false
	}
	return g, false
}

// reencoded returns frame (size, header of hlen bytes, body) with its
// body replaced by req encoded at its version.
func reencoded(frame []byte, hlen int, req kmsg.Request) []byte {
	body := req.AppendTo(nil)
	out := make([]byte, 4, 4+hlen+len(body))
	binary.BigEndian.PutUint32(out, uint32(hlen+len(body)))
	out = append(out, frame[4:4+hlen]...)
	return append(out, body...)
}

// reencodedResponse returns the response frame made of head (size and
// response header, as they came) and resp encoded at its version, with
// the size set.
func reencodedResponse(head []byte, resp kmsg.Response) []byte {
	out := append(make([]byte, 0, len(head)+64), head...)
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out
}

// queueFindCoordinator answers a FindCoordinator for groups with
// kproxy's listener for the cluster's coordinator broker of each group,
// the groups kproxy serves too (any listener serves them; this one's
// connection reaches the broker that serves the group once it goes to
// the cluster, so a member's requests that follow a hand-back go
// upstream on it as they are, joinRefused), or, when the cluster cannot
// say, the listener asked. The forwarder is asked off the reader; the
// answer keeps its place in the queue.
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
			h, p, ok := s.p.brokerListener(node)
			switch {
			case ok:
				*nodeID, *host, *port = node, h, p
			case forward:
				*nodeID, *host, *port, *code = -1, "", -1, kerr.CoordinatorNotAvailable.Code
			}
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

// routeKind sends a share or streams group request (codec.GroupKind)
// to the cluster's coordinator: upstream on the client's connection,
// unchanged, once the forwarder knows the group as the cluster's, so a
// broker that is not the group's coordinator answers NOT_COORDINATOR and
// the client's next FindCoordinator, which kproxy now answers with the
// cluster's coordinator, puts it right. Only a group kproxy serves as a
// consumer group is answered by kproxy, with the error Kafka gives for a
// group of another kind (wrongKind). Without a forwarder (anchors off)
// the request goes upstream as it came.
func (s *session) routeKind(h codec.RequestHeader, kind string, start int64, head []byte, total int) error {
	fw := s.p.cfg.Forwarder
	if fw == nil {
		return s.forward(h, codec.Forward, start, head, total)
	}
	if err := s.authGate(h); err != nil {
		return err
	}
	if limit := s.p.cfg.MaxGroupRequest; total-4 > int(limit) {
		// Larger than any group request kproxy reads: the broker
		// judges it, as directly.
		return s.forward(h, codec.Forward, start, head, total)
	}
	frame, done, err := s.readFrame(total)
	if err != nil {
		return err
	}
	defer done()
	req := kmsg.RequestForKey(h.Key)
	req.SetVersion(h.Version)
	if err := req.ReadFrom(frame[4+h.Len:]); err != nil {
		// The broker answers a malformed request as it does directly.
		return s.forwardBytes(h, codec.Forward, start, frame, nil)
	}
	ctx, cancel := context.WithTimeout(s.p.ctx, lookupTimeout)
	defer cancel()
	groups := kindGroups(req)
	served := len(groups) > 0
	for _, g := range groups {
		if !fw.Claim(ctx, g, kind) {
			served = false
		}
	}
	if !served {
		return s.forwardBytes(h, codec.Forward, start, frame, nil)
	}
	s.p.log.Debug("forwarding: a consumer group asked for as another kind", "kind", kind, "groups", groups)
	return s.queueLocal(h, start, wrongKind(req, kind))
}

// kindGroups returns the group ids of a share or streams group request.
func kindGroups(req kmsg.Request) []string {
	switch r := req.(type) {
	case *kmsg.ShareGroupHeartbeatRequest:
		return []string{r.GroupID}
	case *kmsg.ShareGroupDescribeRequest:
		return r.GroupIDs
	case *kmsg.DescribeShareGroupOffsetsRequest:
		ids := make([]string, len(r.Groups))
		for i, g := range r.Groups {
			ids[i] = g.GroupID
		}
		return ids
	case *kmsg.AlterShareGroupOffsetsRequest:
		return []string{r.GroupID}
	case *kmsg.DeleteShareGroupOffsetsRequest:
		return []string{r.GroupID}
	case *kmsg.StreamsGroupHeartbeatRequest:
		return []string{r.Group}
	case *kmsg.StreamsGroupDescribeRequest:
		return r.Groups
	case *kmsg.StreamsGroupTopologyDescriptionUpdateRequest:
		return []string{r.Group}
	}
	return nil
}

// wrongKind answers req, a request of kind for groups kproxy serves as
// consumer groups, as Kafka's coordinator answers a request for a group
// of another type: GROUP_ID_NOT_FOUND, "Group <id> is not a share group."
// (GroupMetadataManager: one group id is one group, whatever its kind).
func wrongKind(req kmsg.Request, kind string) kmsg.Response {
	code := kerr.GroupIDNotFound.Code
	msg := func(g string) *string {
		m := "Group " + g + " is not a " + kind + " group."
		return &m
	}
	resp := req.ResponseKind()
	switch r := resp.(type) {
	case *kmsg.ShareGroupHeartbeatResponse:
		r.ErrorCode, r.ErrorMessage = code, msg(req.(*kmsg.ShareGroupHeartbeatRequest).GroupID)
	case *kmsg.StreamsGroupHeartbeatResponse:
		r.ErrorCode, r.ErrorMessage = code, msg(req.(*kmsg.StreamsGroupHeartbeatRequest).Group)
	case *kmsg.AlterShareGroupOffsetsResponse:
		r.ErrorCode, r.ErrorMessage = code, msg(req.(*kmsg.AlterShareGroupOffsetsRequest).GroupID)
	case *kmsg.DeleteShareGroupOffsetsResponse:
		r.ErrorCode, r.ErrorMessage = code, msg(req.(*kmsg.DeleteShareGroupOffsetsRequest).GroupID)
	case *kmsg.StreamsGroupTopologyDescriptionUpdateResponse:
		r.ErrorCode, r.ErrorMessage = code, msg(req.(*kmsg.StreamsGroupTopologyDescriptionUpdateRequest).Group)
	case *kmsg.ShareGroupDescribeResponse:
		for _, g := range req.(*kmsg.ShareGroupDescribeRequest).GroupIDs {
			d := kmsg.NewShareGroupDescribeResponseGroup()
			d.GroupID, d.ErrorCode, d.ErrorMessage = g, code, msg(g)
			r.Groups = append(r.Groups, d)
		}
	case *kmsg.StreamsGroupDescribeResponse:
		for _, g := range req.(*kmsg.StreamsGroupDescribeRequest).Groups {
			d := kmsg.NewStreamsGroupDescribeResponseGroup()
			d.Group, d.ErrorCode, d.ErrorMessage = g, code, msg(g)
			r.Groups = append(r.Groups, d)
		}
	case *kmsg.DescribeShareGroupOffsetsResponse:
		for _, g := range req.(*kmsg.DescribeShareGroupOffsetsRequest).Groups {
			d := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
			d.GroupID, d.ErrorCode, d.ErrorMessage = g.GroupID, code, msg(g.GroupID)
			r.Groups = append(r.Groups, d)
		}
	}
	return resp
}

// ClusterJoiner is implemented by a GroupForwarder that can ask the
// cluster's coordinator for a member id on a member's behalf.
type ClusterJoiner interface {
	// JoinAtCluster is called, off the session's reader and the
	// coordinator, for a JoinGroup the coordinator refused
	// NOT_COORDINATOR because its group went to the cluster's
	// coordinator while the join waited (a hand-back). It sends the
	// cluster's coordinator the join without its member id, and returns
	// the member id the answer hands out (KIP-394's MEMBER_ID_REQUIRED),
	// watched as the answer to a join forwarded from c; ok is false when
	// it did not get one (a join that cannot get one: an older version,
	// a static member; or the group is no longer being handed back). It
	// must not keep req.
	JoinAtCluster(ctx context.Context, c Client, req *kmsg.JoinGroupRequest) (memberID string, ok bool)
}

// ForwardWatcher is implemented by a GroupForwarder that watches the
// classic group traffic it forwards, to know the members of a forwarded
// group that are behind kproxy (takeover, docs/anchors.md).
type ForwardWatcher interface {
	// Watch is called on the session's reader when req, a request for
	// forwarded group from client c, goes upstream (and, for a KIP-848
	// leave the coordinator refused NOT_COORDINATOR as its group went
	// to the cluster, with that answer: session.leaveRefused). It returns the
	// function the decoded response is handed to (nil: the response
	// never came, or did not decode), or nil not to watch it. It must
	// not block, and must copy what it keeps of req and of the
	// response: both alias kproxy's buffers. The function may change
	// the HeartbeatIntervalMillis of a ConsumerGroupHeartbeat response
	// (and nothing else): the client is then sent the response
	// re-encoded with it.
	Watch(c Client, group string, req kmsg.Request) func(kmsg.Response)
}
