package groupstate

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// TestEveryVersionAnswered sends every served request at every version
// kmsg knows, with plausible content, and checks the answer: right type,
// the request's version, and an encoding that decodes and re-encodes to
// the same bytes.
func TestEveryVersionAnswered(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 1)
	member := ids[0]
	for _, key := range codec.GroupKeys() {
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

// TestEngineServesTheGroupKeys checks the engine against codec's routing
// table, the one list of the keys kproxy serves itself: Handle serves
// every key codec.IsGroupKey names, the share groups' membership keys
// (codec.IsShareCoordinatorKey), and no other.
func TestEngineServesTheGroupKeys(t *testing.T) {
	logs := &unservedLog{}
	h := newHarness(t, func(c *Config) { c.Logger = slog.New(logs) })
	for key := range int16(100) {
		req := kmsg.RequestForKey(key)
		if req == nil {
			continue
		}
		// v0 with every field at its default: each group API answers
		// at once (an empty group id is invalid), and the engine
		// logs every key it does not serve.
		resp := h.do(req)
		if resp.Key() != key {
			t.Errorf("%s: answered with key %d", kmsg.NameForKey(key), resp.Key())
		}
		if unserved, group := logs.has(key), codec.IsGroupKey(key) || codec.IsShareCoordinatorKey(key); unserved == group {
			t.Errorf("%s: engine serves it %v, codec routes it to the engine %v", kmsg.NameForKey(key), !unserved, group)
		}
	}
}

// unservedLog is a slog.Handler that records the keys the engine says it
// does not serve.
type unservedLog struct {
	mu   sync.Mutex
	keys map[int64]bool // guarded by mu
}

func (l *unservedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *unservedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *unservedLog) WithGroup(string) slog.Handler            { return l }

func (l *unservedLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "groupstate: request not served by the engine" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "api_key" {
			l.mu.Lock()
			if l.keys == nil {
				l.keys = make(map[int64]bool)
			}
			l.keys[a.Value.Int64()] = true
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *unservedLog) has(key int16) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys[int64(key)]
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
