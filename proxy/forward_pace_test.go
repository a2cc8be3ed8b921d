package proxy

import (
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// TestReencodedResponse: a ConsumerGroupHeartbeat answer whose heartbeat
// interval a ForwardWatcher changed goes to the client with the
// response header as it came (correlation id, header tags), the new
// interval, every other field unchanged and the frame size right.
func TestReencodedResponse(t *testing.T) {
	for _, version := range []int16{0, 1} {
		id := "member-1"
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.SetVersion(version)
		resp.MemberID, resp.MemberEpoch, resp.HeartbeatIntervalMillis = &id, 7, 5000
		resp.Assignment = &kmsg.ConsumerGroupHeartbeatResponseAssignment{
			Topics: []kmsg.ConsumerGroupHeartbeatResponseAssignmentTopic{{TopicID: [16]byte{9}, Partitions: []int32{0, 3}}},
		}
		// size, correlation id 42, the flexible header's tags (none), body.
		frame := []byte{0, 0, 0, 0, 0, 0, 0, 42, 0}
		frame = resp.AppendTo(frame)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))

		body, err := codec.ResponseBody(frame[4:], resp.Key(), version)
		if err != nil {
			t.Fatal(err)
		}
		got := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		got.SetVersion(version)
		if err := got.ReadFrom(body); err != nil {
			t.Fatal(err)
		}
		got.HeartbeatIntervalMillis = 500
		out := reencodedResponse(frame[:len(frame)-len(body)], got)

		if n := int(binary.BigEndian.Uint32(out)); n != len(out)-4 {
			t.Fatalf("v%d: frame size %d, want %d", version, n, len(out)-4)
		}
		if corr := binary.BigEndian.Uint32(out[4:]); corr != 42 {
			t.Fatalf("v%d: correlation id %d, want 42", version, corr)
		}
		body, err = codec.ResponseBody(out[4:], resp.Key(), version)
		if err != nil {
			t.Fatal(err)
		}
		back := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		back.SetVersion(version)
		if err := back.ReadFrom(body); err != nil {
			t.Fatalf("v%d: re-encoded answer does not decode: %v", version, err)
		}
		if back.HeartbeatIntervalMillis != 500 || back.MemberEpoch != 7 || back.MemberID == nil || *back.MemberID != id ||
			back.Assignment == nil || len(back.Assignment.Topics) != 1 || len(back.Assignment.Topics[0].Partitions) != 2 {
			t.Fatalf("v%d: re-encoded answer %+v", version, back)
		}
	}
}
