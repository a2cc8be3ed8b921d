package e2e

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// TestProtocolAgnosticGroups drives groups the way Kafka Connect workers
// ("connect"), Schema Registry's leader election ("sr") and Kafka Streams
// (a "consumer" group with its own assignor and user data) do, through
// kproxy: the leader receives every member's metadata byte for byte, and
// each member receives exactly the bytes the leader assigned it. A member
// the leader leaves out gets a valid empty assignment: zero bytes for
// non-consumer protocols (as Kafka), a decodable empty consumer assignment
// for "consumer" (some clients fail on zero bytes).
func TestProtocolAgnosticGroups(t *testing.T) {
	// The initial rebalance delay gathers the three joins into one
	// generation, as it does for real groups starting together.
	s := newStack(t, engineOpt(func(c *groupstate.Config) { c.InitialRebalanceDelay = 300 * time.Millisecond }))
	for _, tc := range []struct {
		protocolType, protocol string
	}{
		{"connect", "sessioned"},
		{"sr", "v0"},
		{"consumer", "stream"},
	} {
		t.Run(tc.protocolType, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			group := "proto-" + tc.protocolType
			const n = 3
			clients := make([]*kgo.Client, n)
			for i := range clients {
				clients[i] = s.client()
			}
			meta := func(i int) []byte {
				return []byte(fmt.Sprintf("%s-metadata-of-member-%d-\x00\xff", tc.protocolType, i))
			}
			type joined struct {
				resp *kmsg.JoinGroupResponse
				idx  int
			}
			results := make(chan joined, n)
			var wg sync.WaitGroup
			for i, cl := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					member := ""
					for ctx.Err() == nil {
						req := kmsg.NewPtrJoinGroupRequest()
						req.Group, req.MemberID, req.ProtocolType = group, member, tc.protocolType
						req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 10000, 10000
						req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: tc.protocol, Metadata: meta(i)}}
						resp, err := req.RequestWith(ctx, cl)
						if err != nil {
							t.Errorf("join: %v", err)
							return
						}
						member = resp.MemberID
						if resp.ErrorCode != 0 {
							continue // MEMBER_ID_REQUIRED
						}
						results <- joined{resp, i}
						return
					}
				}()
			}
			// Every member joins one generation.
			var all []joined
			for len(all) < n {
				select {
				case j := <-results:
					all = append(all, j)
				case <-ctx.Done():
					t.Fatalf("%d of %d members joined", len(all), n)
				}
			}
			wg.Wait()
			gen := all[0].resp.Generation
			var leader joined
			ids := map[int]string{}
			for _, j := range all {
				ids[j.idx] = j.resp.MemberID
				if j.resp.Generation != gen {
					t.Fatalf("members in generations %d and %d", gen, j.resp.Generation)
				}
				if *j.resp.Protocol != tc.protocol || *j.resp.ProtocolType != tc.protocolType {
					t.Fatalf("protocol %v/%v", j.resp.ProtocolType, j.resp.Protocol)
				}
				if j.resp.LeaderID == j.resp.MemberID {
					leader = j
				}
			}
			if leader.resp == nil {
				t.Fatal("no member was told it leads")
			}
			// The leader sees every member's metadata, byte for byte.
			if len(leader.resp.Members) != n {
				t.Fatalf("leader got %d members", len(leader.resp.Members))
			}
			for _, m := range leader.resp.Members {
				found := false
				for i, id := range ids {
					if id == m.MemberID {
						found = true
						if !bytes.Equal(m.ProtocolMetadata, meta(i)) {
							t.Fatalf("member %d metadata %q reached the leader as %q", i, meta(i), m.ProtocolMetadata)
						}
					}
				}
				if !found {
					t.Fatalf("leader got unknown member %s", m.MemberID)
				}
			}
			// The leader assigns opaque bytes to all but the last member.
			assigned := map[string][]byte{}
			for i := range n - 1 {
				assigned[ids[i]] = []byte(fmt.Sprintf("assignment-for-%d-\x01\x02", i))
			}
			got := make(chan error, n)
			for _, j := range all {
				go func() {
					req := kmsg.NewPtrSyncGroupRequest()
					req.Group, req.MemberID, req.Generation = group, j.resp.MemberID, gen
					req.ProtocolType, req.Protocol = kmsg.StringPtr(tc.protocolType), kmsg.StringPtr(tc.protocol)
					if j.resp.MemberID == leader.resp.MemberID {
						for id, a := range assigned {
							req.GroupAssignment = append(req.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: id, MemberAssignment: a})
						}
					}
					resp, err := req.RequestWith(ctx, clients[j.idx])
					switch {
					case err != nil:
						got <- err
					case resp.ErrorCode != 0:
						got <- fmt.Errorf("member %d: sync error %d", j.idx, resp.ErrorCode)
					case j.idx < n-1 && !bytes.Equal(resp.MemberAssignment, assigned[j.resp.MemberID]):
						got <- fmt.Errorf("member %d got %q, leader sent %q", j.idx, resp.MemberAssignment, assigned[j.resp.MemberID])
					case j.idx == n-1 && tc.protocolType == "consumer":
						var a kmsg.ConsumerMemberAssignment
						if err := a.ReadFrom(resp.MemberAssignment); err != nil || len(resp.MemberAssignment) == 0 || len(a.Topics) != 0 {
							got <- fmt.Errorf("left-out consumer member got %x (%v)", resp.MemberAssignment, err)
							return
						}
						got <- nil
					case j.idx == n-1 && len(resp.MemberAssignment) != 0:
						got <- fmt.Errorf("left-out %s member got %q, want no bytes", tc.protocolType, resp.MemberAssignment)
					default:
						got <- nil
					}
				}()
			}
			for range n {
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			// Everyone leaves so later subtests start clean.
			leave := kmsg.NewPtrLeaveGroupRequest()
			leave.Group = group
			for _, id := range ids {
				m := kmsg.NewLeaveGroupRequestMember()
				m.MemberID = id
				leave.Members = append(leave.Members, m)
			}
			if _, err := leave.RequestWith(ctx, clients[0]); err != nil {
				t.Fatal(err)
			}
		})
	}
	s.assertBrokersSawNoGroupTraffic()
}
