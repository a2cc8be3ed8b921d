package groupstate

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzConsumerGroupScript drives a KIP-848 group with an arbitrary script
// of member actions (joins, heartbeats that report their partitions or
// not, leaves, static leaves, heartbeats with made-up epochs, time
// passing, topics resized) and checks what must hold whatever the clients
// do: every request is answered exactly once, the engine never lists a
// partition under two members, member epochs never exceed the group
// epoch, and a response never hands a member a partition the engine
// records under another member.
func FuzzConsumerGroupScript(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19})
	f.Add([]byte{0, 1, 2, 5, 6, 7, 5, 6, 7, 5, 6, 7, 35, 15, 16, 17, 30, 31, 32, 33, 34})
	f.Add([]byte("members come and go while topics grow and time flies"))
	f.Add([]byte{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 37, 0, 1, 2, 3, 4, 30, 0, 1, 2, 3, 4, 20, 21, 22, 23, 24})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 300 {
			script = script[:300]
		}
		runConsumerScript(t, script)
	})
}

func runConsumerScript(t *testing.T, script []byte) {
	h := &consumerHarness{newHarness(t)}
	h.store.SetTopic("t", 3)
	h.store.SetTopic("u", 2)
	h.refresh()
	const n = 5
	type cl struct {
		id       string
		instance string
		joined   bool
		epoch    int32
		owned    partSet
		gen      int // bumps the member id after a static leave
	}
	cls := make([]*cl, n)
	for i := range cls {
		cls[i] = &cl{id: fmt.Sprintf("m%d", i), owned: partSet{}}
		if i >= 3 {
			cls[i].instance = fmt.Sprintf("inst%d", i)
		}
	}
	send := func(c *cl, r *kmsg.ConsumerGroupHeartbeatRequest) *kmsg.ConsumerGroupHeartbeatResponse {
		if c.instance != "" {
			inst := c.instance
			r.InstanceID = &inst
		}
		return h.do(r).(*kmsg.ConsumerGroupHeartbeatResponse)
	}
	apply := func(c *cl, resp *kmsg.ConsumerGroupHeartbeatResponse) {
		switch resp.ErrorCode {
		case errNone:
			c.epoch = resp.MemberEpoch
			if resp.Assignment != nil {
				c.owned = partSet{}
				for _, tp := range resp.Assignment.Topics {
					for _, p := range tp.Partitions {
						c.owned.add(tp.TopicID, p)
					}
				}
			}
		default:
			// Fenced, unknown, refused: the client drops everything
			// and joins again later.
			c.joined, c.epoch, c.owned = false, 0, partSet{}
		}
	}
	check := func(step int) {
		t.Helper()
		d := h.describe("g")
		if d.ErrorCode != errNone {
			return
		}
		if d.AssignmentEpoch > d.Epoch {
			t.Fatalf("step %d: assignment epoch %d above group epoch %d", step, d.AssignmentEpoch, d.Epoch)
		}
		holder := make(map[string]string)
		for _, m := range d.Members {
			if m.MemberEpoch > d.Epoch {
				t.Fatalf("step %d: member %s at epoch %d above group epoch %d", step, m.MemberID, m.MemberEpoch, d.Epoch)
			}
			for _, at := range m.Assignment.TopicPartitions {
				for _, p := range at.Partitions {
					k := fmt.Sprintf("%x/%d", at.TopicID[:2], p)
					if o, dup := holder[k]; dup {
						t.Fatalf("step %d: partition %s held by %s and %s", step, k, o, m.MemberID)
					}
					holder[k] = m.MemberID
				}
			}
		}
		for _, c := range cls {
			if !c.joined {
				continue
			}
			for topic, parts := range c.owned {
				for p := range parts {
					k := fmt.Sprintf("%x/%d", topic[:2], p)
					if o, ok := holder[k]; ok && o != c.id {
						// Legitimate only if c was expired and does
						// not know yet: the engine no longer lists it.
						listed := false
						for _, m := range d.Members {
							listed = listed || m.MemberID == c.id
						}
						if listed {
							t.Fatalf("step %d: %s was given %s, which the engine lists under %s", step, c.id, k, o)
						}
					}
				}
			}
		}
	}
	for step, b := range script {
		c := cls[int(b)%n]
		switch (int(b) / n) % 8 {
		case 0, 1: // join, or a well-behaved heartbeat
			if !c.joined {
				if c.instance != "" {
					c.gen++
					c.id = fmt.Sprintf("m%d-%d", int(b)%n, c.gen)
				}
				topics := []string{"t"}
				if b%2 == 0 {
					topics = append(topics, "u")
				}
				resp := send(c, consumerJoin("g", c.id, topics...))
				c.joined = resp.ErrorCode == errNone
				apply(c, resp)
				continue
			}
			apply(c, send(c, consumerBeat("g", c.id, c.epoch, c.owned)))
		case 2: // a heartbeat that does not report its partitions
			if c.joined {
				apply(c, send(c, consumerBeat("g", c.id, c.epoch, nil)))
			}
		case 3: // leave (static members leave for a while)
			if c.joined {
				epoch := int32(-1)
				if c.instance != "" {
					epoch = -2
				}
				send(c, consumerBeat("g", c.id, epoch, nil))
				c.joined, c.epoch, c.owned = false, 0, partSet{}
			}
		case 4: // a made-up epoch
			if c.joined {
				apply(c, send(c, consumerBeat("g", c.id, int32(b)%7, c.owned)))
			}
		case 5:
			h.advance(3 * time.Second)
		case 6:
			h.advance(20 * time.Second)
		case 7: // a topic resized
			h.store.SetTopic("t", 1+int32(b)%6)
			h.refresh()
		}
		check(step)
	}
}
