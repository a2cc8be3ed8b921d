package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// instantCoordinator answers every heartbeat at once, on the caller's
// goroutine, with one shared response: what is left to count is the
// proxy's own cost of a local request.
type instantCoordinator struct{ resp *kmsg.HeartbeatResponse }

func (c instantCoordinator) Handle(_ Client, req kmsg.Request, reply func(kmsg.Response)) {
	if req.Key() != 12 {
		reply(req.ResponseKind())
		return
	}
	reply(c.resp)
}

// TestLocalReplyAllocs locks in the allocations of a heartbeat kproxy
// serves itself, coordinator aside: the frame read whole (the decoded
// request aliases it and the coordinator keeps it), the request struct
// and its two strings (group and member id). The place in the response
// order and the way back from the coordinator (a pooled localReply) cost
// nothing; a channel and a closure per request did.
func TestLocalReplyAllocs(t *testing.T) {
	resp := kmsg.NewPtrHeartbeatResponse()
	resp.SetVersion(4)
	up := startFakeUpstream(t)
	p := startProxy(t, []string{up.addr}, func(cfg *Config) {
		cfg.MetadataInterval = time.Hour
		cfg.Coordinator = instantCoordinator{resp: resp}
	})
	rc := dialRaw(t, p.Addr())
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("alloc-test"))
	for _, pipelined := range []int{1, 16} {
		var frames []byte
		for i := range pipelined {
			hb := kmsg.NewPtrHeartbeatRequest()
			hb.SetVersion(4)
			hb.Group, hb.MemberID, hb.Generation = "g", "member-1", 1
			frames = append(frames, f.AppendRequest(nil, hb, int32(i))...)
		}
		const perRun = 10
		var rtErr error
		run := func() {
			for range perRun {
				if err := rc.roundTrip(frames, pipelined); err != nil && rtErr == nil {
					rtErr = err
				}
			}
		}
		for range 5 {
			run()
		}
		allocs := testing.AllocsPerRun(100, run) / float64(perRun*pipelined)
		if rtErr != nil {
			t.Fatalf("round trip through the proxy: %v", rtErr)
		}
		t.Logf("pipelined %d: %.2f allocations per local heartbeat", pipelined, allocs)
		if raceEnabled() {
			continue
		}
		if max := 4.0; allocs > max {
			t.Errorf("pipelined %d: %.2f allocations per local heartbeat, want <= %v (go test -run TestLocalReplyAllocs -memprofile mem.out -memprofilerate 1 ./proxy)", pipelined, allocs, max)
		}
	}
}
