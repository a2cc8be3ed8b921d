package codec

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// AddrMap maps upstream brokers to the proxy addresses clients must see.
// The proxy implements it; a call also teaches the proxy the upstream
// address of nodeID, so a broker first seen in a response gets its
// listener on the fly.
type AddrMap interface {
	Broker(nodeID int32, host string, port int32) (proxyHost string, proxyPort int32)
}

// RewriteResponse decodes the response body to a request of key at
// version, edits it as RouteFor's Decision.Edit says (broker addresses
// replaced through m, ApiVersions merged), and returns the response to
// encode in its place. It returns nil when the body needs no change and
// may be sent as it came: the key's responses are not edited, or the
// edit's condition does not hold. localGroups is what the session passed
// to RouteFor, and is passed on to MergeApiVersions.
func RewriteResponse(key, version int16, body []byte, m AddrMap, localGroups bool) (kmsg.Response, error) {
	edit := RouteFor(key, version, localGroups).Edit
	switch edit {
	case EditNone, EditObserve:
		return nil, nil
	case EditIfEndpoints:
		// Skimmed without decoding: most responses carry none.
		if has, ok := HasEndpoints(key, body, version); ok && !has {
			return nil, nil
		}
	}
	req := kmsg.RequestForKey(key)
	if req == nil {
		return nil, fmt.Errorf("%w %d", ErrUnknownAPI, key)
	}
	resp := req.ResponseKind()
	if key == KeyApiVersions && len(body) >= 2 && int16(binary.BigEndian.Uint16(body)) == kerr.UnsupportedVersion.Code {
		// A broker answers an ApiVersions version it does not speak in
		// v0, so the client can read the versions it does speak and
		// retry; the error code comes first in every version.
		version = 0
	}
	resp.SetVersion(version)
	if err := resp.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decoding %s v%d response: %w", kmsg.NameForKey(key), version, err)
	}
	switch r := resp.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			b.Host, b.Port = m.Broker(b.NodeID, b.Host, b.Port)
		}
		for i := range r.Topics {
			// kproxy's own state topics are as internal to clients as
			// __consumer_offsets: regex subscriptions skip them.
			if t := r.Topics[i].Topic; t != nil && strings.HasPrefix(*t, InternalTopicPrefix) {
				r.Topics[i].IsInternal = true
			}
		}
	case *kmsg.FindCoordinatorResponse:
		rewriteCoordinator(m, &r.NodeID, &r.Host, &r.Port)
		for i := range r.Coordinators {
			c := &r.Coordinators[i]
			rewriteCoordinator(m, &c.NodeID, &c.Host, &c.Port)
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			b.Host, b.Port = m.Broker(b.NodeID, b.Host, b.Port)
		}
	case *kmsg.ProduceResponse:
		if len(r.Brokers) == 0 { // EditIfEndpoints, when the skim failed
			return nil, nil
		}
		for i := range r.Brokers {
			b := &r.Brokers[i]
			b.Host, b.Port = m.Broker(b.NodeID, b.Host, b.Port)
		}
	case *kmsg.ShareFetchResponse:
		if len(r.NodeEndpoints) == 0 { // when the skim failed
			return nil, nil
		}
		for i := range r.NodeEndpoints {
			b := &r.NodeEndpoints[i]
			b.Host, b.Port = m.Broker(b.NodeID, b.Host, b.Port)
		}
	case *kmsg.ShareAcknowledgeResponse:
		if len(r.NodeEndpoints) == 0 {
			return nil, nil
		}
		for i := range r.NodeEndpoints {
			b := &r.NodeEndpoints[i]
			b.Host, b.Port = m.Broker(b.NodeID, b.Host, b.Port)
		}
	case *kmsg.ApiVersionsResponse:
		if edit == EditIfNoError && r.ErrorCode != 0 {
			// An error answer (UNSUPPORTED_VERSION carries only the
			// broker's ApiVersions range) is not the broker's table:
			// merging group keys into it would make the client take
			// them for the whole table. It passes as the broker gave it.
			return nil, nil
		}
		MergeApiVersions(r, localGroups)
	default:
		return nil, nil
	}
	return resp, nil
}

// InternalTopicPrefix starts the names of kproxy's own topics (group
// metadata), which Metadata responses mark internal.
const InternalTopicPrefix = "__kproxy"

// rewriteCoordinator maps one coordinator; node -1 (no coordinator, with
// an error) stays as is.
func rewriteCoordinator(m AddrMap, node *int32, host *string, port *int32) {
	if *node < 0 || *host == "" {
		return
	}
	*host, *port = m.Broker(*node, *host, *port)
}

// ProduceAcks reads the acks field from the start of a Produce request
// body at version. ok is false when b is too short to hold it.
func ProduceAcks(b []byte, version int16) (acks int16, ok bool) {
	i := 0
	if version >= 3 { // transactional id, a nullable string
		if version >= 9 {
			n, w := binary.Uvarint(b)
			if w <= 0 {
				return 0, false
			}
			i = w
			if n > 1 {
				i += int(n - 1)
			}
		} else {
			if len(b) < 2 {
				return 0, false
			}
			n := int16(binary.BigEndian.Uint16(b))
			i = 2
			if n > 0 {
				i += int(n)
			}
		}
	}
	if i < 0 || len(b) < i+2 {
		return 0, false
	}
	return int16(binary.BigEndian.Uint16(b[i:])), true
}
