package groupstate

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestEveryVersionAnswered sends every served request at every version
// kmsg knows, with plausible content, and checks the answer: right type,
// the request's version, and an encoding that decodes and re-encodes to
// the same bytes.
func TestEveryVersionAnswered(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 1)
	member := ids[0]
	for _, key := range Keys() {
		proto := kmsg.RequestForKey(key)
		if proto == nil {
			t.Fatalf("kmsg does not know key %d", key)
		}
		for v := int16(0); v <= proto.MaxVersion(); v++ {
			req := kmsg.RequestForKey(key)
			req.SetVersion(v)
			fill(req, member, gen)
			t.Logf("key %d v%d", key, v)
			resp := h.do(req)
			if resp == nil {
				t.Fatalf("key %d v%d: nil response", key, v)
			}
			if resp.Key() != key || resp.GetVersion() != v {
				t.Fatalf("key %d v%d: response key %d version %d", key, v, resp.Key(), resp.GetVersion())
			}
			enc := resp.AppendTo(nil)
			dec := req.ResponseKind()
			dec.SetVersion(v)
			if err := dec.ReadFrom(enc); err != nil {
				t.Fatalf("key %d v%d: response does not decode: %v", key, v, err)
			}
			if again := dec.AppendTo(nil); !bytes.Equal(again, enc) {
				t.Fatalf("key %d v%d: response re-encodes differently", key, v)
			}
		}
	}
}

// fill puts a group, member and topic into a request.
func fill(req kmsg.Request, member string, gen int32) {
	md := "m"
	switch r := req.(type) {
	case *kmsg.OffsetCommitRequest:
		r.Group, r.MemberID, r.Generation = "g", member, gen
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Offset, p.Metadata = 5, &md
		r.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{p}}}
	case *kmsg.OffsetFetchRequest:
		r.Group = "g"
		r.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0}}}
		r.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "g", MemberEpoch: -1, Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t", Partitions: []int32{0}}}}}
	case *kmsg.JoinGroupRequest:
		r.Group, r.MemberID = "g", member
		r.SessionTimeoutMillis, r.RebalanceTimeoutMillis = 10000, 30000
		r.ProtocolType = "consumer"
		r.Protocols = []kmsg.JoinGroupRequestProtocol{protocol("range", "t")}
		// A fresh group per version: answered at once below v4,
		// MEMBER_ID_REQUIRED from v4.
		r.Group = "other-" + string(rune('a'+r.Version))
		r.MemberID = ""
	case *kmsg.HeartbeatRequest:
		r.Group, r.MemberID, r.Generation = "g", member, gen
	case *kmsg.LeaveGroupRequest:
		r.Group, r.MemberID = "g", "ghost"
		r.Members = []kmsg.LeaveGroupRequestMember{{MemberID: "ghost"}}
	case *kmsg.SyncGroupRequest:
		r.Group, r.MemberID, r.Generation = "g", member, gen
	case *kmsg.DescribeGroupsRequest:
		r.Groups = []string{"g", "missing"}
	case *kmsg.ListGroupsRequest:
	case *kmsg.TxnOffsetCommitRequest:
		r.Group, r.TransactionalID = "g", "tx"
		r.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Offset: 1}}}}
	case *kmsg.DeleteGroupsRequest:
		r.Groups = []string{"missing"}
	case *kmsg.OffsetDeleteRequest:
		r.Group = "g"
		r.Topics = []kmsg.OffsetDeleteRequestTopic{{Topic: "u", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}}}
	}
}
