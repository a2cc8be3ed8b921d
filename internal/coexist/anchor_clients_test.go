package coexist

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/classic"
)

// TestAnchorJoinHeldHoldsUpNoOther: the cluster holds a JoinGroup into
// a group it rebalances until the group's other members rejoin (here a
// direct member that does not, for its rebalance timeout). Another
// anchor's join into another group must not wait for it. On the store's
// own client both go on one connection, which the broker serves one
// request at a time: the shared case shows the wait, the pooled one
// that it is gone (internal/clientpool).
func TestAnchorJoinHeldHoldsUpNoOther(t *testing.T) {
	const hold = 6 * time.Second // the rebalance timeout of every member
	for _, pooled := range []bool{false, true} {
		name := map[bool]string{false: "shared client", true: "pooled clients"}[pooled]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			newClient := newKfakeClient(t)
			store := kafkastore.New(newClient())
			o := AnchorOptions{SessionTimeout: 30 * time.Second, RebalanceTimeout: 30 * time.Second}
			if pooled {
				o.NewClient = func() (*kgo.Client, error) { return newClient(), nil }
			}
			as := EnableAnchors(store, o)
			t.Cleanup(func() { as.Close(context.Background(), false) })
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
			if pooled && as.joins.Made() != 2 {
				t.Fatalf("the pool made %d clients for two joins at once, want 2", as.joins.Made())
			}
		})
	}
}

// newKfakeClient starts a one-broker kfake cluster and returns a maker
// of clients of it.
func newKfakeClient(t testing.TB) func() *kgo.Client {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	return func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		if err != nil {
			t.Fatalf("kgo: %v", err)
		}
		t.Cleanup(cl.Close)
		return cl
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

// commitGate is a dialer whose connections can hold one OffsetCommit:
// armed, the next write of an OffsetCommit frame blocks until release
// closes, as a broker that has not answered the commit before it holds
// every later request of that connection.
type commitGate struct {
	mu    sync.Mutex // guards armed
	armed bool

	held    chan struct{} // closed when a commit is held
	release chan struct{} // closed by the test to let it go
}

func (g *commitGate) dial(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, g: g}, nil
}

func (g *commitGate) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

type gatedConn struct {
	net.Conn
	g *commitGate
}

// Write holds the armed commit: kgo writes each request frame in one
// Write, its API key after the 4-byte length.
func (c *gatedConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && int16(binary.BigEndian.Uint16(b[4:6])) == kmsg.OffsetCommit.Int16() {
		c.g.mu.Lock()
		hold := c.g.armed
		c.g.armed = false
		c.g.mu.Unlock()
		if hold {
			close(c.g.held)
			<-c.g.release
		}
	}
	return c.Conn.Write(b)
}

// TestCommitWaitsOnNoOtherGroupsCommit: a commit of one group must not
// wait for the answer to another group's commit, as directly, where
// each member has a connection of its own (internal/clientpool). The shared
// case shows the wait on the store's one client; the pooled case that
// it is gone.
func TestCommitWaitsOnNoOtherGroupsCommit(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		name := map[bool]string{false: "shared client", true: "pooled clients"}[pooled]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			g := &commitGate{held: make(chan struct{}), release: make(chan struct{})}
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(g.release) }) }
			t.Cleanup(release)
			newClient := func() (*kgo.Client, error) {
				cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.Dialer(g.dial))
				if err == nil {
					t.Cleanup(cl.Close)
				}
				return cl, err
			}
			cl, err := newClient()
			if err != nil {
				t.Fatal(err)
			}
			store := kafkastore.New(cl)
			o := AnchorOptions{}
			if pooled {
				o.NewClient = newClient
			}
			as := EnableAnchors(store, o)
			t.Cleanup(func() { as.Close(context.Background(), false) })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			commit := func(ctx context.Context, group string, offset int64) error {
				topics := []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: offset, LeaderEpoch: -1}}}}
				resp, err := store.CommitOffsets(ctx, group, topics)
				if err != nil {
					return err
				}
				for _, rt := range resp {
					for _, rp := range rt.Partitions {
						if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
							return err
						}
					}
				}
				return nil
			}
			// Unheld first: connections, metadata, coordinators.
			for _, group := range []string{"a", "b"} {
				if err := commit(ctx, group, 1); err != nil {
					t.Fatalf("commit of %s: %v", group, err)
				}
			}

			g.arm()
			heldErr := make(chan error, 1)
			go func() { heldErr <- commit(ctx, "a", 2) }()
			select {
			case <-g.held:
			case <-ctx.Done():
				t.Fatal("the commit of a was never written")
			}
			bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
			err = commit(bctx, "b", 2)
			bcancel()
			if pooled && err != nil {
				t.Fatalf("the commit of b, while a's waits for its answer: %v", err)
			}
			if !pooled && err == nil {
				t.Fatal("on one client the commit of b went through while a's write was held: the test proves nothing")
			}
			release()
			if err := <-heldErr; err != nil {
				t.Fatalf("the held commit of a: %v", err)
			}
		})
	}
}
