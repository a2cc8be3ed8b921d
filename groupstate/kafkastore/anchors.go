package kafkastore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/clientpool"
)

// The store's side of the anchors (docs/anchors.md; package
// internal/coexist holds them). With anchors set (SetAnchors), the store
// asks them at four points of its own work: a commit of a group with
// members in the engine goes under its anchor's identity, a load first
// asks whether the cluster serves the group itself (or returns a
// takeover's record), and a delete waits for the anchor to have left;
// and it passes the engine's Anchor and Unanchor on. Everything else
// here is a primitive the anchors use: the store's client, its
// coordinator cache and its pool of clients for coordinator requests.

// Anchors is what the store asks of the anchors.
type Anchors interface {
	groupstate.AnchorStore
	// Commit sends the OffsetCommit build makes under group's anchor's
	// identity; anchored is false (and nothing was sent) when the group
	// has no anchor to commit under: the store commits as without one.
	Commit(ctx context.Context, group string, build func() *kmsg.OffsetCommitRequest) (resp *kmsg.OffsetCommitResponse, anchored bool, err error)
	// TxnCommit sends req (identified topics, no member) under its
	// group's anchor's identity; anchored as for Commit.
	TxnCommit(ctx context.Context, req *kmsg.TxnOffsetCommitRequest) (resp *kmsg.TxnOffsetCommitResponse, anchored bool, err error)
	// CheckLoad is the load-time check of group: an error wrapping
	// groupstate.ErrGroupLiveOnCluster when the cluster serves it, or
	// the record of a takeover prepared for it (nil if none).
	CheckLoad(ctx context.Context, group string) (takeover []byte, err error)
	// AwaitGone waits until group's anchor holds no membership, for a
	// delete.
	AwaitGone(ctx context.Context, group string) error
}

// SetAnchors turns the store's anchor points on; reqs, when not nil,
// lends the clients for the store's requests to group coordinators
// (lend). Call it once, before the store is shared.
func (s *Store) SetAnchors(a Anchors, reqs *clientpool.Pool) {
	s.anchors = a
	s.reqs = reqs
}

// Anchor implements groupstate.AnchorStore: passed on to the anchors,
// if set.
func (s *Store) Anchor(group string, want groupstate.Anchor) {
	if s.anchors != nil {
		s.anchors.Anchor(group, want)
	}
}

// Unanchor implements groupstate.AnchorStore: passed on to the anchors,
// if set.
func (s *Store) Unanchor(group string) {
	if s.anchors != nil {
		s.anchors.Unanchor(group)
	}
}

// Client is the store's client of the cluster.
func (s *Store) Client() *kgo.Client { return s.cl }

// Logger is the store's logger.
func (s *Store) Logger() *slog.Logger { return s.log }

// GroupCoordinatorNode is the node id of group's coordinator, from the
// store's cache (FindCoordinator on a miss).
func (s *Store) GroupCoordinatorNode(ctx context.Context, group string) (int32, error) {
	return s.coordinator(ctx, coordinatorGroup, group)
}

// GroupRequest sends req to group's coordinator on a client lent to it
// alone, retrying on a moved or loading coordinator as the store's own
// requests do; code reads the answer's error code, maxVersion caps the
// version sent.
func (s *Store) GroupRequest(ctx context.Context, group string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	return s.coordRequest(ctx, coordinatorGroup, group, req, maxVersion, code)
}

// GroupRequestOn is GroupRequest sending on cl.
func (s *Store) GroupRequestOn(ctx context.Context, cl *kgo.Client, group string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	return s.coordRequestOn(ctx, cl, coordinatorGroup, group, req, maxVersion, code)
}

// ClusterKeys asks the cluster, with ApiVersions on cl, which API keys
// it answers, each with its highest version.
func ClusterKeys(ctx context.Context, cl kmsg.Requestor) (map[int16]int16, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kproxy", "1"
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("ApiVersions: %w", err)
	}
	keys := make(map[int16]int16, len(resp.ApiKeys))
	for _, k := range resp.ApiKeys {
		keys[k.ApiKey] = k.MaxVersion
	}
	return keys, nil
}

// SupportsKey reports whether the cluster answers requests of key (asked
// once, with ApiVersions, and remembered).
func (s *Store) SupportsKey(ctx context.Context, key int16) bool {
	s.mu.Lock()
	keys := s.apiKeys
	s.mu.Unlock()
	if keys == nil {
		var err error
		if keys, err = ClusterKeys(ctx, s.cl); err != nil {
			return false
		}
		s.mu.Lock()
		s.apiKeys = keys
		s.mu.Unlock()
	}
	_, ok := keys[key]
	return ok
}

// LacksKey reports whether the cluster is known not to answer requests
// of key: its ApiVersions was read and does not list it (a failed
// ApiVersions proves nothing).
func (s *Store) LacksKey(ctx context.Context, key int16) bool {
	if s.SupportsKey(ctx, key) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apiKeys != nil
}

// GroupCoordinator asks the cluster for the node id of group's
// coordinator (FindCoordinator, not cached: the answer goes to a client
// that follows it).
func (s *Store) GroupCoordinator(ctx context.Context, group string) (int32, error) {
	s.forgetCoordinator(coordinatorGroup, group)
	return s.coordinator(ctx, coordinatorGroup, group)
}
