package coexist

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/upstream"
)

// ClusterGroups is the cluster's own groups (groupstate.ClusterGroups,
// the engine's Config.ClusterGroups): what ListGroups, DescribeGroups
// and ConsumerGroupDescribe through kproxy answer for the groups kproxy's
// engine does not hold, so that they look as they do against the
// brokers. It is safe for concurrent use; it holds nothing but its
// immutable client and store.
//
// The requests go through the client's sharded requests (what kadm's
// ListGroups and DescribeGroups use underneath): ListGroups to every
// broker, since each lists only the groups it coordinates, and the
// describes to each group's coordinator, with kgo's coordinator lookups
// and retries. kadm itself is not used because it converts the answers
// to its own types; the engine passes the cluster's kmsg entries on
// unchanged (error codes, messages, member metadata, authorized
// operations), which a round trip through kadm's types would not keep.
type ClusterGroups struct {
	cl *kgo.Client       // immutable: up's client
	up *upstream.Cluster // immutable: which API keys the cluster answers
}

var _ groupstate.ClusterGroups = (*ClusterGroups)(nil)

// NewClusterGroups is the cluster's groups as up's client sees them.
func NewClusterGroups(up *upstream.Cluster) *ClusterGroups {
	return &ClusterGroups{cl: up.Client(), up: up}
}

// ListClusterGroups implements groupstate.ClusterGroups. A group listed
// by two brokers (its coordinator moving) is listed once, the first
// answer winning, as kgo's merge does. kproxy's fleet group (protocol
// type fleet.ProtocolType) is left out: it is kproxy's machinery, not an
// application's group; kproxy's anchors need no filtering, they are
// members of the groups they anchor, not groups of their own.
func (c *ClusterGroups) ListClusterGroups(ctx context.Context) ([]kmsg.ListGroupsResponseGroup, error) {
	req := kmsg.NewPtrListGroupsRequest() // no filter: every state, every type
	var out []kmsg.ListGroupsResponseGroup
	seen := make(map[string]bool)
	var first error
	for _, sh := range c.cl.RequestSharded(ctx, req) {
		err := sh.Err
		if sh.Resp != nil {
			resp := sh.Resp.(*kmsg.ListGroupsResponse)
			if err == nil {
				err = kerr.ErrorForCode(resp.ErrorCode)
			}
			for _, g := range resp.Groups {
				if seen[g.Group] || g.ProtocolType == fleet.ProtocolType {
					continue
				}
				seen[g.Group] = true
				if resp.Version < 5 && g.GroupType == "" {
					// Before KIP-848 (ListGroups v5) every group is
					// a classic group.
					g.GroupType = "classic"
				}
				out = append(out, g)
			}
		}
		if err != nil && first == nil {
			first = fmt.Errorf("listing the groups of broker %d: %w", sh.Meta.NodeID, err)
		}
	}
	return out, first
}

// DescribeClusterGroups implements groupstate.ClusterGroups.
func (c *ClusterGroups) DescribeClusterGroups(ctx context.Context, groups []string, includeOps bool) ([]kmsg.DescribeGroupsResponseGroup, error) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.IncludeAuthorizedOperations = includeOps
	return describeSharded(ctx, c.cl, req, groups, &req.Groups,
		func(r kmsg.Request) []string { return r.(*kmsg.DescribeGroupsRequest).Groups },
		func(r kmsg.Response) []kmsg.DescribeGroupsResponseGroup {
			return r.(*kmsg.DescribeGroupsResponse).Groups
		},
		func(g kmsg.DescribeGroupsResponseGroup) string { return g.Group },
		func(id string, code int16) kmsg.DescribeGroupsResponseGroup {
			g := kmsg.NewDescribeGroupsResponseGroup()
			g.Group, g.ErrorCode = id, code
			return g
		})
}

// DescribeClusterConsumerGroups implements groupstate.ClusterGroups.
func (c *ClusterGroups) DescribeClusterConsumerGroups(ctx context.Context, groups []string, includeOps bool) ([]kmsg.ConsumerGroupDescribeResponseGroup, error) {
	errEntry := func(id string, code int16) kmsg.ConsumerGroupDescribeResponseGroup {
		g := kmsg.NewConsumerGroupDescribeResponseGroup()
		g.Group, g.ErrorCode = id, code
		return g
	}
	if c.up.LacksKey(ctx, kmsg.ConsumerGroupDescribe.Int16()) {
		// A cluster from before KIP-848 has no consumer groups: each is
		// answered as Kafka answers an unknown one.
		out := make([]kmsg.ConsumerGroupDescribeResponseGroup, 0, len(groups))
		for _, id := range distinct(groups) {
			g := errEntry(id, kerr.GroupIDNotFound.Code)
			msg := "Group " + id + " not found."
			g.ErrorMessage = &msg
			out = append(out, g)
		}
		return out, nil
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.IncludeAuthorizedOperations = includeOps
	return describeSharded(ctx, c.cl, req, groups, &req.Groups,
		func(r kmsg.Request) []string { return r.(*kmsg.ConsumerGroupDescribeRequest).Groups },
		func(r kmsg.Response) []kmsg.ConsumerGroupDescribeResponseGroup {
			return r.(*kmsg.ConsumerGroupDescribeResponse).Groups
		},
		func(g kmsg.ConsumerGroupDescribeResponseGroup) string { return g.Group },
		errEntry)
}

// describeSharded sends req for the distinct ids (set in *items) to
// their coordinators and returns one entry per distinct id, in order. A
// group whose coordinator could not be asked (no coordinator found,
// every retry failed) gets an entry with the error's code; the first
// such error is returned too. An answer, even one carrying a group-level
// error code, wins over a failure of another try.
func describeSharded[G any](ctx context.Context, cl *kgo.Client, req kmsg.Request, groups []string, items *[]string,
	reqGroups func(kmsg.Request) []string, respGroups func(kmsg.Response) []G, name func(G) string,
	errEntry func(id string, code int16) G,
) ([]G, error) {
	ids := distinct(groups)
	if len(ids) == 0 {
		return nil, nil
	}
	*items = ids
	answered := make(map[string]G, len(ids))
	failed := make(map[string]int16)
	var first error
	for _, sh := range cl.RequestSharded(ctx, req) {
		if sh.Resp != nil {
			for _, g := range respGroups(sh.Resp) {
				answered[name(g)] = g
			}
			continue
		}
		if sh.Err == nil {
			continue
		}
		if first == nil {
			first = fmt.Errorf("%s: %w", kmsg.NameForKey(req.Key()), sh.Err)
		}
		of := ids
		if sh.Req != nil {
			of = reqGroups(sh.Req)
		}
		for _, id := range of {
			failed[id] = shardErrorCode(sh.Err)
		}
	}
	out := make([]G, len(ids))
	for i, id := range ids {
		if g, ok := answered[id]; ok {
			out[i] = g
			continue
		}
		code, ok := failed[id]
		if !ok {
			code = kerr.CoordinatorNotAvailable.Code // neither answered nor failed: not expected
		}
		out[i] = errEntry(id, code)
	}
	return out, first
}

// shardErrorCode is the code a group gets whose request failed with err:
// a Kafka error's own code (a coordinator lookup's answer), otherwise
// (transport errors, timeouts) COORDINATOR_NOT_AVAILABLE, which clients
// retry after looking the coordinator up again.
func shardErrorCode(err error) int16 {
	if ke := (*kerr.Error)(nil); errors.As(err, &ke) {
		return ke.Code
	}
	return kerr.CoordinatorNotAvailable.Code
}

// distinct returns ids without repeats, in first-seen order.
func distinct(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
