package groupstate

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestLeaveHoldsJoinOpenInAnchoredGroup: in a group anchored in the
// cluster's coordinator, the rebalance a leave starts does not complete
// before leaveJoinHold, even with every other member rejoined, so that a
// member moved back to the cluster meanwhile finds the members still in
// their join when the hand-back begins (classic_handback.go). Without an
// anchor store it completes as soon as everyone rejoined, as Kafka's.
func TestLeaveHoldsJoinOpenInAnchoredGroup(t *testing.T) {
	for _, anchored := range []bool{true, false} {
		name := map[bool]string{true: "anchored", false: "plain"}[anchored]
		t.Run(name, func(t *testing.T) {
			var h *harness
			if anchored {
				rec := &anchorRecorder{MemoryStore: NewMemoryStore(), last: make(map[string]Anchor)}
				h = newHarness(t, func(c *Config) { c.Store = rec })
			} else {
				h = newHarness(t)
			}
			ids, gen := h.stableGroup("g", 3)
			lv := kmsg.NewPtrLeaveGroupRequest()
			lv.Version = 5
			lv.Group = "g"
			lv.Members = []kmsg.LeaveGroupRequestMember{{MemberID: ids[2]}}
			if resp := h.do(lv).(*kmsg.LeaveGroupResponse); resp.ErrorCode != 0 || resp.Members[0].ErrorCode != 0 {
				t.Fatalf("leave: %+v", resp)
			}
			a := h.send(jr{group: "g", member: ids[0], version: 9}.req())
			b := h.send(jr{group: "g", member: ids[1], version: 9}.req())
			if !anchored {
				if r := joinResp(t, a, 0); r.Generation != gen+1 {
					t.Fatalf("join after leave: generation %d, want %d", r.Generation, gen+1)
				}
				joinResp(t, b, 0)
				return
			}
			a.parked(h)
			b.parked(h)
			h.advance(leaveJoinHold / 2)
			a.parked(h)
			h.advance(leaveJoinHold / 2)
			if r := joinResp(t, a, 0); r.Generation != gen+1 || len(r.Members) != 2 {
				t.Fatalf("join after the hold: generation %d with %d members, want %d with 2", r.Generation, len(r.Members), gen+1)
			}
			joinResp(t, b, 0)
		})
	}
}
