package groupstate

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzEngineScript drives the engine with an arbitrary script of member
// actions (joins at every version, static and dynamic, syncs with
// overlapping or partial assignments, heartbeats, leaves, commits, time
// passing) and checks invariants that must hold whatever the clients do:
// every request is answered exactly once (after Close at the latest), no
// illegal state transition is attempted, generations only grow, and a
// SyncGroup answer never hands one partition to two members of the same
// generation when the leader's plan did not.
func FuzzEngineScript(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 16, 1, 1, 17, 2, 2, 18, 3, 40, 41, 42, 43, 9, 9, 9})
	f.Add([]byte{5, 21, 37, 53, 69, 85, 101, 117, 133, 149, 165, 181, 197, 213, 229, 245})
	f.Add([]byte("static members restart while the leader syncs and time flies"))
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 400 {
			script = script[:400]
		}
		runScript(t, script)
	})
}

func runScript(t *testing.T, script []byte) {
	// A script that hangs the engine is a failure, not a stuck fuzzer.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("script %x hung:\n%s", script, buf[:runtime.Stack(buf, true)]))
		}
	}()
	h := newHarness(t, func(c *Config) {
		c.MaxGroupSize = 4
		c.NewMemberJoinTimeout = 20 * time.Second
		c.InitialRebalanceDelay = 0 // 3s default: exercise the delay chain
	})
	const members = 6
	type slot struct {
		id       string
		gen      int32
		leader   bool
		instance string
		members  []string
	}
	slots := make([]slot, members)
	for i := range slots {
		if i%3 == 0 {
			slots[i].instance = fmt.Sprintf("inst-%d", i)
		}
	}
	type pendingCall struct {
		c    *call
		slot int
	}
	var calls []pendingCall
	var lastGen int32 = -1
	// learn updates a slot from a JoinGroup answer.
	learn := func(i int, r kmsg.Response) {
		jr, ok := r.(*kmsg.JoinGroupResponse)
		if !ok {
			return
		}
		if jr.MemberID != "" && (jr.ErrorCode == 0 || jr.ErrorCode == errMemberIDRequired) {
			slots[i].id = jr.MemberID
		}
		if jr.ErrorCode == 0 {
			slots[i].gen = jr.Generation
			slots[i].leader = jr.LeaderID == jr.MemberID
			slots[i].members = slots[i].members[:0]
			for _, m := range jr.Members {
				slots[i].members = append(slots[i].members, m.MemberID)
			}
		}
	}
	send := func(i int, req kmsg.Request) { calls = append(calls, pendingCall{h.send(req), i}) }
	for pos, b := range script {
		i := int(b) % members
		s := &slots[i]
		switch op := int(b) / members % 8; op {
		case 0, 1: // join, at a version from the script
			v := int16(script[(pos+1)%len(script)] % 10)
			j := jr{group: "g", member: s.id, version: v, instance: s.instance}
			if v < 5 {
				j.instance = ""
			}
			if op == 1 {
				j.protocols = []kmsg.JoinGroupRequestProtocol{protocol("range", "t"), protocol("roundrobin", "t", fmt.Sprint(pos%3))}
			}
			send(i, j.req())
		case 2: // sync; a leader assigns partition k to member k
			var assign map[string][]byte
			if s.leader {
				assign = map[string][]byte{}
				for k, id := range s.members {
					if b%5 != 0 || k%2 == 0 { // sometimes leave members out
						assign[id] = assignment("t", int32(k))
					}
				}
			}
			r := syncReq("g", s.id, s.gen, assign)
			if s.instance != "" {
				iid := s.instance
				r.InstanceID = &iid
			}
			send(i, r)
		case 3, 4: // heartbeat
			send(i, hb("g", s.id, s.gen))
		case 5: // leave, by member id or by instance
			lv := kmsg.NewPtrLeaveGroupRequest()
			lv.Version = int16(b % 6)
			lv.Group, lv.MemberID = "g", s.id
			m := kmsg.NewLeaveGroupRequestMember()
			m.MemberID = s.id
			if s.instance != "" && b%2 == 0 {
				iid := s.instance
				m.InstanceID = &iid
				m.MemberID = ""
			}
			lv.Members = []kmsg.LeaveGroupRequestMember{m}
			send(i, lv)
		case 6: // commit
			send(i, commitReq(int16(b%11), "g", s.id, s.gen, int32(i), int64(pos)))
		case 7: // time passes
			h.advance(time.Duration(b) * 100 * time.Millisecond)
		}
		// Answered joins update their slot; the rest stay pending.
		pending := calls[:0]
		for _, pc := range calls {
			if r, ok := pc.c.answered(h); ok {
				learn(pc.slot, r)
				continue
			}
			pending = append(pending, pc)
		}
		calls = pending
		if snap, ok := h.e.Group("g"); ok {
			if snap.Generation < lastGen {
				t.Fatalf("generation went back from %d to %d", lastGen, snap.Generation)
			}
			lastGen = snap.Generation
		}
	}
	// Far enough in the future every timer has fired; then Close answers
	// whatever is still parked. Each call must be answered exactly once
	// (the harness fails the test on a second reply).
	h.advance(time.Hour)
	h.e.Close()
	for _, pc := range calls {
		pc.c.wait()
	}
	// Within one generation, the stored assignments are disjoint.
	for _, ev := range h.takeEvents("g") {
		if ev.Kind != EventSyncCompleted {
			continue
		}
		owner := map[int32]string{}
		for _, m := range ev.Members {
			owned := decodeOwned(m.Assignment)
			for p := range owned["t"] {
				if o, dup := owner[p]; dup {
					t.Fatalf("generation %d: partition %d owned by %s and %s", ev.Generation, p, o, m.MemberID)
				}
				owner[p] = m.MemberID
			}
		}
	}
}
