package proxy

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// refusingCoordinator answers every JoinGroup NOT_COORDINATOR, as the
// engine answers the joins waiting in a rebalance when a hand-back
// begins, but a member's whose id starts with "ok", answered at once.
type refusingCoordinator struct{}

func (refusingCoordinator) Handle(_ Client, req kmsg.Request, reply func(kmsg.Response)) {
	jr := req.(*kmsg.JoinGroupRequest)
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.SetVersion(jr.Version)
	resp.MemberID = jr.MemberID
	if len(jr.MemberID) < 2 || jr.MemberID[:2] != "ok" {
		resp.ErrorCode = kerr.NotCoordinator.Code
	}
	reply(resp)
}

// joiningForwarder serves every group (forwards none), names node 2 as
// every group's coordinator at the cluster, and gets a member id from
// the cluster for any refused join but a static member's, recording the
// member ids it was asked for.
type joiningForwarder struct {
	mu    sync.Mutex
	asked []string
}

func (*joiningForwarder) Forwarded(string) bool { return false }
func (*joiningForwarder) Lookup(context.Context, string) (int32, bool, error) {
	return 2, false, nil
}
func (*joiningForwarder) Claim(context.Context, string, string) bool { return false }
func (f *joiningForwarder) JoinAtCluster(_ context.Context, _ Client, req *kmsg.JoinGroupRequest) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, req.MemberID)
	if req.InstanceID != nil {
		return "", false
	}
	return "cluster-" + req.MemberID, true
}

// TestJoinRefusedAtHandBackJoinsTheCluster: a JoinGroup the coordinator
// refuses NOT_COORDINATOR (its group went to the cluster as the join
// waited) is answered MEMBER_ID_REQUIRED with the member id the cluster
// handed out for it, at the request's version, so the member joins there
// at once; one the forwarder gets no id for keeps the coordinator's
// NOT_COORDINATOR, and a join the coordinator answered is left alone.
// FindCoordinator for a group kproxy serves names kproxy's listener for
// the broker the cluster names its coordinator, where the member's
// joins then go.
func TestJoinRefusedAtHandBackJoinsTheCluster(t *testing.T) {
	c := newCluster(t)
	fw := &joiningForwarder{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Coordinator = refusingCoordinator{}
		cfg.Forwarder = fw
	})
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	corr := int32(0)
	roundTrip := func(req kmsg.Request) kmsg.Response {
		t.Helper()
		corr++
		rawRequest(t, conn, req, corr, "join-refused")
		got, resp := readResponse(t, conn, req)
		if got != corr {
			t.Fatalf("answer with correlation id %d, want %d", got, corr)
		}
		return resp
	}
	meta := kmsg.NewPtrMetadataRequest()
	meta.SetVersion(9)
	roundTrip(meta) // kproxy opens a listener per broker
	host, port, ok := p.brokerListener(2)
	if !ok {
		t.Fatal("no listener for broker 2 after a metadata request")
	}
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.SetVersion(4)
	fc.CoordinatorKeys = []string{"g"}
	co := roundTrip(fc).(*kmsg.FindCoordinatorResponse).Coordinators
	if len(co) != 1 || co[0].ErrorCode != 0 || co[0].NodeID != 2 || co[0].Host != host || co[0].Port != port {
		t.Fatalf("FindCoordinator of a group kproxy serves: %+v, want node 2 at %s:%d", co, host, port)
	}

	static := "i1"
	for _, tc := range []struct {
		member   string
		version  int16
		instance *string
		code     int16
		id       string
	}{
		{"engine-1", 5, nil, kerr.MemberIDRequired.Code, "cluster-engine-1"},
		{"engine-2", 9, nil, kerr.MemberIDRequired.Code, "cluster-engine-2"},
		{"engine-3", 5, &static, kerr.NotCoordinator.Code, "engine-3"},
		{"ok-4", 5, nil, 0, "ok-4"},
	} {
		join := kmsg.NewPtrJoinGroupRequest()
		join.SetVersion(tc.version)
		join.Group, join.MemberID, join.InstanceID, join.ProtocolType = "g", tc.member, tc.instance, "consumer"
		join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = 10_000, 30_000
		resp := roundTrip(join).(*kmsg.JoinGroupResponse)
		if resp.ErrorCode != tc.code || resp.MemberID != tc.id {
			t.Errorf("join of %s v%d: %v with member id %q, want %v with %q", tc.member, tc.version,
				kerr.ErrorForCode(resp.ErrorCode), resp.MemberID, kerr.ErrorForCode(tc.code), tc.id)
		}
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if want := []string{"engine-1", "engine-2", "engine-3"}; len(fw.asked) != len(want) || fw.asked[0] != want[0] || fw.asked[1] != want[1] || fw.asked[2] != want[2] {
		t.Fatalf("asked the cluster for %q, want for %q (only refused joins)", fw.asked, want)
	}
}
