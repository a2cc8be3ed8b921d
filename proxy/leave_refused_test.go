package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// unloadingCoordinator answers every ConsumerGroupHeartbeat
// NOT_COORDINATOR after marking its group forwarded, as the engine does
// when a hand-back unloads the group as the request arrives.
type unloadingCoordinator struct{ fw *watchingForwarder }

func (c unloadingCoordinator) Handle(_ Client, req kmsg.Request, reply func(kmsg.Response)) {
	hb := req.(*kmsg.ConsumerGroupHeartbeatRequest)
	c.fw.forwarded.Store(true)
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.SetVersion(hb.Version)
	resp.ErrorCode = kerr.NotCoordinator.Code
	reply(resp)
}

// watchingForwarder forwards nothing until forwarded is set and records
// what it is asked to watch.
type watchingForwarder struct {
	forwarded atomic.Bool
	mu        sync.Mutex
	watched   []string // member id and answer code of each watched request
}

func (f *watchingForwarder) Forwarded(string) bool { return f.forwarded.Load() }
func (f *watchingForwarder) Lookup(context.Context, string) (int32, bool, error) {
	return 0, false, nil
}
func (f *watchingForwarder) Claim(context.Context, string, string) bool { return false }
func (f *watchingForwarder) Watch(_ Client, _ string, req kmsg.Request) func(kmsg.Response) {
	id := req.(*kmsg.ConsumerGroupHeartbeatRequest).MemberID
	return func(resp kmsg.Response) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.watched = append(f.watched, id+" "+kerr.ErrorForCode(resp.(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode).Error())
	}
}

// TestLeaveRefusedAsGroupLeavesIsWatched: a KIP-848 leave that the
// coordinator refuses NOT_COORDINATOR because its group just went to the
// cluster's coordinator is reported to the forward watcher, as a leave
// forwarded would have been, so that a hand-back does not wait for that
// member; the client still gets the coordinator's answer. A heartbeat
// that is not a leave, refused the same way, is not reported.
func TestLeaveRefusedAsGroupLeavesIsWatched(t *testing.T) {
	fw := &watchingForwarder{}
	up := startFakeUpstream(t)
	p := startProxy(t, []string{up.addr}, func(c *Config) {
		c.Coordinator = unloadingCoordinator{fw}
		c.Forwarder = fw
	})
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	send := func(memberID string, epoch int32) *kmsg.ConsumerGroupHeartbeatResponse {
		t.Helper()
		fw.forwarded.Store(false)
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.SetVersion(0)
		req.Group, req.MemberID, req.MemberEpoch = "g", memberID, epoch
		frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("test")).AppendRequest(nil, req, 7)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatal(err)
		}
		body, err := codec.ResponseBody(buf, req.Key(), 0)
		if err != nil {
			t.Fatal(err)
		}
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.SetVersion(0)
		if err := resp.ReadFrom(body); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := send("m1", 3); resp.ErrorCode != kerr.NotCoordinator.Code {
		t.Fatalf("heartbeat answered %v, want the coordinator's NOT_COORDINATOR", kerr.ErrorForCode(resp.ErrorCode))
	}
	if resp := send("m2", -1); resp.ErrorCode != kerr.NotCoordinator.Code {
		t.Fatalf("leave answered %v, want the coordinator's NOT_COORDINATOR", kerr.ErrorForCode(resp.ErrorCode))
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if len(fw.watched) != 1 || fw.watched[0] != "m2 "+kerr.NotCoordinator.Error() {
		t.Fatalf("watched %q, want only m2's leave with its NOT_COORDINATOR", fw.watched)
	}
}
