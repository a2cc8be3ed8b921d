package classic

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestOutcomeOf(t *testing.T) {
	for code, want := range map[int16]Outcome{
		0:                                 OK,
		kerr.RebalanceInProgress.Code:     Rejoin,
		kerr.UnknownMemberID.Code:         Stale,
		kerr.IllegalGeneration.Code:       Stale,
		kerr.FencedInstanceID.Code:        Fenced,
		kerr.CoordinatorNotAvailable.Code: Failed,
	} {
		if got := OutcomeOf(code); got != want {
			t.Errorf("OutcomeOf(%v) = %d, want %d", kerr.ErrorForCode(code), got, want)
		}
	}
}

func TestRequestsCarryTheIdentity(t *testing.T) {
	inst := "kproxy-anchor"
	j := Join{Group: "g", InstanceID: &inst, ProtocolType: "consumer", SessionTimeout: 2 * time.Minute, RebalanceTimeout: 5 * time.Minute,
		Protocols: []kmsg.JoinGroupRequestProtocol{{Name: "range"}}}.Request()
	if j.Group != "g" || j.MemberID != "" || *j.InstanceID != inst || j.SessionTimeoutMillis != 120000 || j.RebalanceTimeoutMillis != 300000 || len(j.Protocols) != 1 {
		t.Fatalf("join = %+v", j)
	}
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.MemberID, resp.Generation = "m-1", 7
	m := Joined("g", &inst, resp)
	s := m.Sync("consumer", "range", nil)
	h := m.Heartbeat()
	l := m.Leave("done")
	if s.MemberID != "m-1" || s.Generation != 7 || *s.InstanceID != inst || *s.Protocol != "range" ||
		h.MemberID != "m-1" || h.Generation != 7 || *h.InstanceID != inst ||
		l.MemberID != "m-1" || len(l.Members) != 1 || *l.Members[0].InstanceID != inst || *l.Members[0].Reason != "done" {
		t.Fatalf("sync %+v, heartbeat %+v, leave %+v", s, h, l)
	}
}

func TestLeaveError(t *testing.T) {
	resp := kmsg.NewPtrLeaveGroupResponse()
	if err := LeaveError(resp); err != nil {
		t.Fatal(err)
	}
	resp.Members = []kmsg.LeaveGroupResponseMember{{MemberID: "m", ErrorCode: kerr.FencedInstanceID.Code}}
	err := LeaveError(resp)
	if !errors.Is(err, kerr.FencedInstanceID) || !Gone(err) {
		t.Fatalf("member error %v: want FENCED_INSTANCE_ID, gone", err)
	}
	resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
	if err := LeaveError(resp); !errors.Is(err, kerr.CoordinatorNotAvailable) || Gone(err) {
		t.Fatalf("group error %v: want COORDINATOR_NOT_AVAILABLE, not gone", err)
	}
}
