package coexist

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/internal/upstream"
)

// TestClusterGroups: ClusterGroups lists and describes the cluster's groups
// as the brokers answer a client directly: a classic group with a member,
// a KIP-848 group, a simple group (offsets only), each from its own
// coordinator among three brokers; kproxy's fleet group (protocol type
// "kproxy") is left out of the list.
func TestClusterGroups(t *testing.T) {
	const topic = "cg-t"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	newClient := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, opts...)...)
		if err != nil {
			t.Fatalf("kgo: %v", err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct := newClient()
	adm := kadm.NewClient(direct)

	// A member of each kind, polling in the background.
	consume := func(group string, opts ...kgo.Opt) {
		cl := newClient(append([]kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)}, opts...)...)
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for pctx.Err() == nil {
				cl.PollFetches(pctx)
			}
		}()
		t.Cleanup(func() { stop(); <-done })
	}
	const classic, kip848, simple, fleetGroup = "cg-classic", "cg-kip848", "cg-simple", "cg-fleet"
	consume(classic)
	consume(kip848, kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer())
	offs := make(kadm.Offsets)
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 5, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(ctx, simple, offs); err != nil {
		t.Fatalf("simple commit: %v", err)
	}
	// The fleet group: one member of protocol type "kproxy", joined and
	// synced by hand.
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType = fleetGroup, fleet.ProtocolType
	join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = 30000, 30000
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: fleet.ProtocolName, Metadata: []byte{0}}}
	jr, err := join.RequestWith(ctx, direct)
	if err == nil && jr.ErrorCode == kerr.MemberIDRequired.Code {
		join.MemberID = jr.MemberID
		jr, err = join.RequestWith(ctx, direct)
	}
	if err != nil || jr.ErrorCode != 0 {
		t.Fatalf("fleet join: %v %v", err, kerr.ErrorForCode(jr.ErrorCode))
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = fleetGroup, jr.MemberID, jr.Generation
	sync.ProtocolType, sync.Protocol = &join.ProtocolType, jr.Protocol
	if sr, err := sync.RequestWith(ctx, direct); err != nil || sr.ErrorCode != 0 {
		t.Fatalf("fleet sync: %v", err)
	}

	// Wait until the cluster lists every group settled.
	directList := func() map[string]kmsg.ListGroupsResponseGroup {
		req := kmsg.NewPtrListGroupsRequest()
		resp, err := req.RequestWith(ctx, direct)
		if err != nil {
			t.Fatalf("direct list: %v", err)
		}
		out := make(map[string]kmsg.ListGroupsResponseGroup)
		for _, g := range resp.Groups {
			out[g.Group] = g
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := directList()
		if l[classic].GroupState == "Stable" && l[kip848].GroupState == "Stable" && l[simple].GroupState == "Empty" && l[fleetGroup].GroupState == "Stable" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups never settled on the cluster: %+v", l)
		}
		time.Sleep(50 * time.Millisecond)
	}

	cg := NewClusterGroups(upstream.New(newClient()))
	listed, err := cg.ListClusterGroups(ctx)
	if err != nil {
		t.Fatalf("ListClusterGroups: %v", err)
	}
	want := directList()
	delete(want, fleetGroup)
	got := make(map[string]kmsg.ListGroupsResponseGroup)
	for _, g := range listed {
		if _, dup := got[g.Group]; dup {
			t.Fatalf("group %s listed twice", g.Group)
		}
		got[g.Group] = g
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ListClusterGroups:\n got %+v\nwant %+v", got, want)
	}
	if got[kip848].GroupType != "consumer" || got[classic].GroupType != "classic" || got[classic].ProtocolType != "consumer" {
		t.Fatalf("types: %+v", got)
	}

	// Descriptions: one per distinct id, in order, each as the
	// cluster's coordinator describes it directly (retried in case a
	// member heartbeat moved something between the two reads).
	ids := []string{classic, simple, "cg-nobody", kip848, classic}
	distinctIDs := ids[:4]
	for attempt := 0; ; attempt++ {
		dreq := kmsg.NewPtrDescribeGroupsRequest()
		dreq.Groups, dreq.IncludeAuthorizedOperations = distinctIDs, true
		dresp, err := dreq.RequestWith(ctx, direct)
		if err != nil {
			t.Fatalf("direct describe: %v", err)
		}
		wantD := make(map[string]kmsg.DescribeGroupsResponseGroup)
		for _, g := range dresp.Groups {
			wantD[g.Group] = g
		}
		gotD, err := cg.DescribeClusterGroups(ctx, ids, true)
		if err != nil {
			t.Fatalf("DescribeClusterGroups: %v", err)
		}
		same := len(gotD) == len(distinctIDs)
		for i := 0; same && i < len(gotD); i++ {
			same = gotD[i].Group == distinctIDs[i] && reflect.DeepEqual(gotD[i], wantD[distinctIDs[i]])
		}
		if same {
			if len(gotD[0].Members) != 1 || gotD[0].State != "Stable" || gotD[2].ErrorCode != kerr.GroupIDNotFound.Code {
				t.Fatalf("unexpected descriptions: %+v", gotD)
			}
			break
		}
		if attempt == 20 {
			t.Fatalf("DescribeClusterGroups:\n got %+v\nwant %+v", gotD, wantD)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for attempt := 0; ; attempt++ {
		creq := kmsg.NewPtrConsumerGroupDescribeRequest()
		creq.Groups = distinctIDs
		cresp, err := creq.RequestWith(ctx, direct)
		if err != nil {
			t.Fatalf("direct consumer describe: %v", err)
		}
		wantC := make(map[string]kmsg.ConsumerGroupDescribeResponseGroup)
		for _, g := range cresp.Groups {
			wantC[g.Group] = g
		}
		gotC, err := cg.DescribeClusterConsumerGroups(ctx, ids, false)
		if err != nil {
			t.Fatalf("DescribeClusterConsumerGroups: %v", err)
		}
		same := len(gotC) == len(distinctIDs)
		for i := 0; same && i < len(gotC); i++ {
			same = gotC[i].Group == distinctIDs[i] && reflect.DeepEqual(gotC[i], wantC[distinctIDs[i]])
		}
		if same {
			if gotC[3].ErrorCode != 0 || len(gotC[3].Members) != 1 {
				t.Fatalf("the KIP-848 group's description: %+v", gotC[3])
			}
			break
		}
		if attempt == 20 {
			t.Fatalf("DescribeClusterConsumerGroups:\n got %+v\nwant %+v", gotC, wantC)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterGroupsUnreachable: a cluster that cannot be reached answers
// every group with a retriable error code, and says why.
func TestClusterGroupsUnreachable(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	addrs := cluster.ListenAddrs()
	cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RetryTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cg := NewClusterGroups(upstream.New(cl))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	got, err := cg.DescribeClusterGroups(ctx, []string{"a", "b", "a"}, false)
	if err == nil || len(got) != 2 || got[0].Group != "a" || got[1].Group != "b" {
		t.Fatalf("describe of an unreachable cluster: %+v, %v", got, err)
	}
	for _, g := range got {
		if g.ErrorCode == 0 {
			t.Fatalf("group %s described without an error", g.Group)
		}
	}
	if _, err := cg.ListClusterGroups(ctx); err == nil {
		t.Fatal("list of an unreachable cluster: no error")
	}
}
