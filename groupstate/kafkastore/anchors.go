package kafkastore

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/upstream"
)

// The store's side of the anchors (docs/anchors.md; package
// internal/coexist holds them). With anchors set (SetAnchors), the store
// asks them at four points of its own work: a commit of a group with
// members in the engine goes under its anchor's identity, a load first
// asks whether the cluster serves the group itself (or returns a
// takeover's record), and a delete waits for the anchor to have left;
// and it passes the engine's Anchor and Unanchor on.

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

// SetAnchors turns the store's anchor points on. Call it once, before
// the store is shared.
func (s *Store) SetAnchors(a Anchors) { s.anchors = a }

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

// Logger is the store's logger.
func (s *Store) Logger() *slog.Logger { return s.log }

// Cluster is the client of the cluster's coordinators the store sends
// its commits and transactions through (package internal/upstream),
// for the anchors and the cluster's own groups to share: one coordinator
// cache and one pool of lent clients for every request of a kproxy.
func (s *Store) Cluster() *upstream.Cluster { return s.up }
