package loadgen

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// TestConnPipelines sends 400 DescribeGroups from 8 goroutines at once
// on one connection to kfake: each answer must name the group its own
// request asked for, so correlation ids, the shared write buffer (a
// request appended behind another keeps its own size prefix) and the
// in-order matching all hold.
func TestConnPipelines(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := Dial(ctx, cluster.ListenAddrs()[0], DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v := c.Version(int16(kmsg.DescribeGroups)); v < 0 {
		t.Fatal("no DescribeGroups version negotiated")
	}
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := range 50 {
				name := fmt.Sprintf("w%d-g%d", w, i)
				req := kmsg.NewPtrDescribeGroupsRequest()
				req.Groups = []string{name}
				resp, err := Request(ctx, c, req)
				if err != nil {
					errs <- err
					return
				}
				if gs := resp.(*kmsg.DescribeGroupsResponse).Groups; len(gs) != 1 || gs[0].Group != name {
					errs <- fmt.Errorf("asked for %s, answered %v", name, gs)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSettleAndHeartbeats settles 20 groups of 3 in waves of 7 on the
// engine itself, then runs the heartbeat load: every group ends in one
// generation with distinct member ids, and heartbeats flow without a
// failure.
func TestSettleAndHeartbeats(t *testing.T) {
	eng, err := groupstate.New(groupstate.Config{Store: groupstate.NewMemoryStore(), InitialRebalanceDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	d := DoerFunc(func(req kmsg.Request, done func(kmsg.Response, error)) {
		req.SetVersion(req.MaxVersion())
		eng.Handle(groupstate.RequestContext{ClientID: "test"}, req, func(r kmsg.Response) { done(r, nil) })
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var members []*Member
	for g := range 20 {
		for range 3 {
			members = append(members, &Member{Group: fmt.Sprintf("g%d", g), D: d})
		}
	}
	if err := Settle(ctx, members, SettleConfig{GroupsAtOnce: 7, PollInterval: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i, m := range members {
		if m.ID == "" || ids[m.ID] {
			t.Fatalf("member %d: id %q empty or repeated", i, m.ID)
		}
		ids[m.ID] = true
		if first := members[i/3*3]; m.Generation != first.Generation {
			t.Fatalf("group %s: generations %d and %d", m.Group, m.Generation, first.Generation)
		}
	}
	l := StartHeartbeats(members)
	time.Sleep(200 * time.Millisecond)
	if err := l.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if l.Answered() < int64(len(members)) || l.Failed() != 0 {
		t.Fatalf("%d heartbeats answered, %d failed", l.Answered(), l.Failed())
	}
}
