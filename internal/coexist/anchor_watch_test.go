package coexist

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// anchorJoins records the session timeouts of the anchors' JoinGroups
// the cluster received, and when.
type anchorJoins struct {
	mu       sync.Mutex // guards sessions and at
	sessions []time.Duration
	at       []time.Time
}

func (j *anchorJoins) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.sessions)
}

func (j *anchorJoins) last() time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.sessions) == 0 {
		return 0
	}
	return j.sessions[len(j.sessions)-1]
}

// anchorCluster starts an in-memory cluster of minimum session minSession
// and anchors over it with o, recording the anchors' joins.
func anchorCluster(t *testing.T, minSession time.Duration, o AnchorOptions) (*kfake.Cluster, *Anchors, *anchorJoins) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(minSession))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	joins := &anchorJoins{}
	cluster.ControlKey(kmsg.JoinGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if r := req.(*kmsg.JoinGroupRequest); r.InstanceID != nil {
			joins.mu.Lock()
			joins.sessions = append(joins.sessions, time.Duration(r.SessionTimeoutMillis)*time.Millisecond)
			joins.at = append(joins.at, time.Now())
			joins.mu.Unlock()
		}
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatalf("kgo: %v", err)
	}
	t.Cleanup(cl.Close)
	as := EnableAnchors(kafkastore.New(cl), o)
	t.Cleanup(func() { as.Close(context.Background(), true) })
	return cluster, as, joins
}

// waitAnchored waits until group's anchor is a member of the cluster's
// group.
func waitAnchored(t *testing.T, as *Anchors, group string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, ok := as.AnchorIdentity(group); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %q never anchored", group)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func consumerAnchor(members int, session time.Duration) groupstate.Anchor {
	return groupstate.Anchor{Members: members, ProtocolType: "consumer", Protocols: []string{"range"},
		Topics: []string{"t"}, Owned: map[string][]int32{"t": {0}}, SessionTimeout: session}
}

// TestAnchorSessionFollowsMembers: an anchor joins with its members'
// longest session, not --group-anchor-session-timeout, so the cluster
// keeps the anchor of a kproxy that died no longer than it would keep
// the members; at least MinSessionTimeout; and with SessionTimeout when
// the cluster refuses the members' (below its
// group.min.session.timeout.ms).
func TestAnchorSessionFollowsMembers(t *testing.T) {
	for _, c := range []struct {
		name                      string
		clusterMin, floor, member time.Duration
		want                      time.Duration
	}{
		{"the members' session", time.Second, 6 * time.Second, 7 * time.Second, 7 * time.Second},
		{"at least the floor", time.Second, 6 * time.Second, 2 * time.Second, 6 * time.Second},
		{"at most the anchors' session", time.Second, 6 * time.Second, 10 * time.Minute, 2 * time.Minute},
		{"refused by the cluster", 6 * time.Second, 3 * time.Second, 4 * time.Second, 2 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, as, joins := anchorCluster(t, c.clusterMin, AnchorOptions{
				SessionTimeout: 2 * time.Minute, MinSessionTimeout: c.floor})
			as.Anchor("g", consumerAnchor(1, c.member))
			waitAnchored(t, as, "g")
			if got := joins.last(); got != c.want {
				t.Fatalf("the anchor joined with session %v (joins %v), want %v", got, joins.sessions, c.want)
			}
			a := as.get("g", false)
			a.mu.Lock()
			next := time.Until(a.nextHeartbeat)
			a.mu.Unlock()
			if next > c.want/4 {
				t.Fatalf("the anchor of session %v heartbeats in %v: more than a quarter of it", c.want, next)
			}
		})
	}
}

// TestWatchSeesConvertedGroup: the anchors find the groups the cluster
// rebalances within RebalanceWatchInterval, with one ListGroups filtered
// by state per coordinator, not at their next heartbeat nor at the
// describe every PollInterval. A group Kafka converted into a KIP-848
// group (its online upgrade when a KIP-848 member joins, which the
// in-memory cluster does not do: its ListGroups answer is replaced here)
// makes the anchor rejoin at once; the JoinGroup answer then hands the
// group back (handBackConsumer). The classic case is
// e2e.TestHandBackAtDirectSpeed.
func TestWatchSeesConvertedGroup(t *testing.T) {
	t.Run("converted to KIP-848", func(t *testing.T) {
		cluster, as, joins := anchorCluster(t, time.Second, AnchorOptions{
			SessionTimeout: 2 * time.Minute, PollInterval: time.Minute, RebalanceWatchInterval: 100 * time.Millisecond})
		as.Anchor("g", consumerAnchor(1, 30*time.Second))
		waitAnchored(t, as, "g")
		before := joins.count()
		var asked sync.Once
		listed := make(chan time.Time, 1)
		cluster.ControlKey(kmsg.ListGroups.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			cluster.KeepControl()
			r := req.(*kmsg.ListGroupsRequest)
			resp := r.ResponseKind().(*kmsg.ListGroupsResponse)
			resp.Version = r.Version
			g := kmsg.NewListGroupsResponseGroup()
			g.Group, g.ProtocolType, g.GroupState, g.GroupType = "g", "consumer", "Reconciling", "consumer"
			resp.Groups = append(resp.Groups, g)
			asked.Do(func() { listed <- time.Now() })
			return resp, nil, true
		})
		at := <-listed
		deadline := time.Now().Add(5 * time.Second)
		for joins.count() == before {
			if time.Now().After(deadline) {
				t.Fatal("the anchor did not rejoin a group the cluster lists as a reconciling KIP-848 group")
			}
			time.Sleep(10 * time.Millisecond)
		}
		joins.mu.Lock()
		took := joins.at[len(joins.at)-1].Sub(at)
		joins.mu.Unlock()
		if took > time.Second {
			t.Fatalf("the anchor rejoined %v after the cluster first listed its group reconciling", took)
		}
	})
}
