package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// refusesAfterJoin answers a JoinGroup as answerAll does and refuses
// everything else with NOT_COORDINATOR, calling refused first: an owner
// that gave its groups up.
type refusesAfterJoin struct{ refused func() }

func (o refusesAfterJoin) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	if _, ok := req.(*kmsg.JoinGroupRequest); ok {
		answerAll{}.Handle(c, req, reply)
		return
	}
	o.refused()
	reply(codec.GroupErrorResponse(req, errNotCoordinator))
}

// TestRouterFollowEndsAtMemberVerdict: a member's request that its owner
// refuses is held for the group's next owner (relay_follow.go), but not
// past the moment the member is to be told to give up
// (relay_members.go): it is then answered UNKNOWN_MEMBER_ID, on time,
// not after the relay timeout. The owner refuses as the table stops
// naming it, so that the request, held while the group has no owner, is
// not sent anywhere again.
func TestRouterFollowEndsAtMemberVerdict(t *testing.T) {
	const session = 1500 * time.Millisecond
	loc := newTestLocator("", map[string]string{})
	ps, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Logger: testLogger(t),
		Coordinator: refusesAfterJoin{refused: func() {
			loc.mu.Lock()
			defer loc.mu.Unlock()
			delete(loc.remote, "g")
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.Close)
	loc.set("g", ps.Addr())
	r := NewRouter(RouterConfig{Locator: loc, Logger: testLogger(t), RelayTimeout: 5 * time.Second})
	defer r.Close()
	c := Client{ID: "test"}
	// The router starts the member's session somewhere inside joinM1:
	// its give-up moment lies between these two.
	first := time.Now().Add(session - giveUpMargin(session))
	joinM1(t, r, c, session)
	last := time.Now().Add(session - giveUpMargin(session))
	resp := handle(t, r, c, heartbeatFor("g", "m1"))
	at := time.Now()
	checkCodes(t, "refused heartbeat held to the member's verdict", resp, errUnknownMemberID)
	if early, late := first.Sub(at), at.Sub(last); early > 50*time.Millisecond || late > 500*time.Millisecond {
		t.Errorf("answered %v after the earliest give-up moment and %v after the latest, want between them", at.Sub(first), at.Sub(last))
	}
}

// TestRouterFollowEndsAtHandBack: a member's request its owner refuses
// because the group went back to the cluster's coordinator
// (PeerServerConfig.Forwarded, the envelope's peerTagHandedBack) is
// passed on at once: no next owner comes, and the member must find the
// cluster's coordinator, as directly, instead of holding its partitions
// while the cluster gives them to others. Refused for any other reason,
// it is held (here until the relay timeout, no next owner appearing).
func TestRouterFollowEndsAtHandBack(t *testing.T) {
	for _, handedBack := range []bool{false, true} {
		loc := newTestLocator("", map[string]string{})
		ps, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Logger: testLogger(t),
			Coordinator: refusesAfterJoin{refused: func() {}},
			Forwarded:   func(group string) bool { return handedBack && group == "g" }})
		if err != nil {
			t.Fatal(err)
		}
		loc.set("g", ps.Addr())
		r := NewRouter(RouterConfig{Locator: loc, Logger: testLogger(t), RelayTimeout: time.Second})
		c := Client{ID: "test"}
		joinM1(t, r, c, 30*time.Second)
		start := time.Now()
		resp := handle(t, r, c, heartbeatFor("g", "m1"))
		took := time.Since(start)
		r.Close()
		ps.Close()
		checkCodes(t, "refused heartbeat", resp, errNotCoordinator)
		switch {
		case handedBack && took > 200*time.Millisecond:
			t.Errorf("handed back: the refusal was held %v, want it passed on at once", took)
		case !handedBack && took < 900*time.Millisecond:
			t.Errorf("not handed back: the refusal was passed on after %v, want it held about the relay timeout (1s)", took)
		}
	}
}
