package kafkastore

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/classic"
)

// TestAnchorJoinHeldHoldsUpNoOther: the cluster holds a JoinGroup into
// a group it rebalances until the group's other members rejoin (here a
// direct member that does not, for its rebalance timeout). Another
// anchor's join into another group must not wait for it. On the store's
// own client both go on one connection, which the broker serves one
// request at a time: the shared case shows the wait, the pooled one
// that it is gone (joinpool.go).
func TestAnchorJoinHeldHoldsUpNoOther(t *testing.T) {
	const hold = 6 * time.Second // the rebalance timeout of every member
	for _, pooled := range []bool{false, true} {
		name := map[bool]string{false: "shared client", true: "pooled clients"}[pooled]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			newClient := newKfakeClient(t)
			store := New(newClient())
			o := AnchorOptions{SessionTimeout: 30 * time.Second, RebalanceTimeout: 30 * time.Second}
			if pooled {
				o.NewClient = func() (*kgo.Client, error) { return newClient(), nil }
			}
			store.EnableAnchors(o)
			t.Cleanup(func() { store.CloseAnchors(context.Background(), false) })
			as := store.anchors
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			// A direct member holds group "held", Stable.
			direct := newClient()
			protos := []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: (&kmsg.ConsumerMemberMetadata{Topics: []string{"t"}}).AppendTo(nil)}}
			join := classic.Join{Group: "held", ProtocolType: "consumer", Protocols: protos,
				SessionTimeout: 30 * time.Second, RebalanceTimeout: hold}
			jr := directJoin(ctx, t, direct, join)
			if jr.ErrorCode == kerr.MemberIDRequired.Code {
				join.MemberID = jr.MemberID
				jr = directJoin(ctx, t, direct, join)
			}
			if jr.ErrorCode != 0 {
				t.Fatalf("direct member's join: %v", kerr.ErrorForCode(jr.ErrorCode))
			}
			sync := kmsg.NewPtrSyncGroupRequest()
			sync.Group, sync.MemberID, sync.Generation = "held", jr.MemberID, jr.Generation
			sr, err := sync.RequestWith(ctx, direct)
			if err != nil || sr.ErrorCode != 0 {
				t.Fatalf("direct member's sync: %v %v", err, sr)
			}

			// An anchor's join into it is held: the cluster rebalances
			// and waits for the direct member.
			code := func(r kmsg.Response) int16 { return r.(*kmsg.JoinGroupResponse).ErrorCode }
			instance := "anchor"
			anchorJoin := func(group string) kmsg.Request {
				return classic.Join{Group: group, InstanceID: &instance, ProtocolType: "consumer", Protocols: protos,
					SessionTimeout: 30 * time.Second, RebalanceTimeout: hold}.Request()
			}
			heldDone := make(chan time.Time, 1)
			start := time.Now()
			go func() {
				if _, err := as.request(ctx, "held", anchorJoin("held"), code); err != nil {
					t.Errorf("held join: %v", err)
				}
				heldDone <- time.Now()
			}()
			time.Sleep(300 * time.Millisecond) // the held join is out first

			resp, err := as.request(ctx, "free", anchorJoin("free"), code)
			if err != nil {
				t.Fatalf("join into an empty group: %v", err)
			}
			if c := code(resp); c != 0 {
				t.Fatalf("join into an empty group: %v", kerr.ErrorForCode(c))
			}
			took := time.Since(start)
			held := (<-heldDone).Sub(start)
			t.Logf("join into an empty group answered after %v, the held one after %v", took, held)
			if held < hold/2 {
				t.Fatalf("the join into the rebalancing group was answered after %v: not held, the test proves nothing", held)
			}
			if pooled && took > hold/2 {
				t.Fatalf("a join into an empty group waited %v behind another group's held join", took)
			}
			if !pooled && took < hold/2 {
				t.Fatalf("on one client the second join took %v: the broker no longer serializes a connection's requests, the pool may be moot", took)
			}
			if pooled && as.joins.made() != 2 {
				t.Fatalf("the pool made %d clients for two joins at once, want 2", as.joins.made())
			}
		})
	}
}

func directJoin(ctx context.Context, t *testing.T, cl *kgo.Client, j classic.Join) *kmsg.JoinGroupResponse {
	t.Helper()
	resp, err := j.Request().RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	return resp
}
