package share

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// FuzzGroupHeartbeats drives a group with joins, heartbeats at right and
// wrong epochs, leaves, session expiries, topic growth and reloads, and
// checks that only Kafka's codes come back, epochs never go backwards
// and, once every member heartbeated at its epoch, the members' partitions
// cover the topics in balance.
func FuzzGroupHeartbeats(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 1, 3, 0, 4, 5})
	f.Add([]byte{0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 6, 0, 2, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		topics := fakeTopics{"a": {ID: tid(1), Partitions: 3}, "b": {ID: tid(2), Partitions: 2}}
		cfg := GroupConfig{SessionTimeout: 10 * time.Second, MaxSize: 5}
		g := NewGroup("g")
		now := t0
		next := func() int {
			if len(ops) == 0 {
				return 0
			}
			v := int(ops[0])
			ops = ops[1:]
			return v
		}
		allowed := map[int16]bool{0: true, kerr.UnknownMemberID.Code: true, kerr.FencedMemberEpoch.Code: true, kerr.GroupMaxSizeReached.Code: true}
		lastEpoch := int32(0)
		for len(ops) > 0 {
			id := fmt.Sprint("m", next()%7)
			var epoch int32
			if m := g.members[id]; m != nil {
				epoch = m.epoch
			}
			switch next() % 7 {
			case 0:
				r := g.Heartbeat(hb(id, 0, "a", "b"), topics, now, cfg)
				if !allowed[r.ErrorCode] {
					t.Fatalf("join: code %d", r.ErrorCode)
				}
			case 1, 2:
				e := epoch
				if len(ops) > 0 && ops[0]%2 == 1 {
					e += int32(next()%3) - 1
				}
				r := g.Heartbeat(hb(id, e), topics, now, cfg)
				// Epoch 0 without a subscription is INVALID_REQUEST.
				if !allowed[r.ErrorCode] && !(r.ErrorCode == kerr.InvalidRequest.Code && (e == 0 || e < -1)) {
					t.Fatalf("heartbeat at %d (member at %d): code %d", e, epoch, r.ErrorCode)
				}
			case 3:
				g.Heartbeat(hb(id, -1), topics, now, cfg)
			case 4:
				now = now.Add(time.Duration(next()) * 100 * time.Millisecond)
				g.Expire(now)
			case 5:
				if topics["a"].Partitions < 40 {
					topics["a"] = Topic{ID: tid(1), Partitions: topics["a"].Partitions + 1}
				}
			case 6:
				s, err := UnmarshalGroup(MarshalGroup(g.Snapshot()))
				if err != nil {
					t.Fatal(err)
				}
				h, err := RestoreGroup(s, now, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(h.Snapshot(), g.Snapshot()) {
					t.Fatal("reload differs")
				}
				g = h
			}
			if g.Epoch() < lastEpoch {
				t.Fatalf("group epoch went back: %d < %d", g.Epoch(), lastEpoch)
			}
			lastEpoch = g.Epoch()
			for _, m := range g.members {
				if m.epoch > g.Epoch() {
					t.Fatalf("member epoch %d above group epoch %d", m.epoch, g.Epoch())
				}
			}
		}
		// Everyone heartbeats; the assignment settles and is balanced.
		for _, id := range g.Members() {
			g.Heartbeat(hb(id, g.members[id].epoch), topics, now, cfg)
		}
		got := map[string][]TopicPartition{}
		for _, id := range g.Members() {
			if g.members[id].epoch != g.AssignmentEpoch() {
				t.Fatalf("%s at epoch %d, target %d", id, g.members[id].epoch, g.AssignmentEpoch())
			}
			got[id] = g.Assignment(id)
		}
		if len(got) > 0 {
			checkAssign(t, got, len(got), int(topics["a"].Partitions+topics["b"].Partitions))
		}
	})
}
