package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/tap"
)

// Share groups (KIP-932) through kproxy, against kfake, which serves
// them (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge, the share
// admin APIs) on three brokers, so a group's coordinator is often not
// the broker a client bootstraps from. kfake has no streams groups: the
// interop tier runs those against Kafka 4.4.

// setShareReset makes a share group start from the log's start
// (share.auto.offset.reset, a group config), directly at the cluster.
func setShareReset(ctx context.Context, t testing.TB, cl *kgo.Client, group string) {
	t.Helper()
	if err := trySetShareReset(ctx, cl, group); err != nil {
		t.Fatalf("setting share.auto.offset.reset of %s: %v", group, err)
	}
}

// trySetShareReset is setShareReset returning its error.
func trySetShareReset(ctx context.Context, cl *kgo.Client, group string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "share.auto.offset.reset", kmsg.StringPtr("earliest")
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}

// shareRun is what the share consumers of one group read.
type shareRun struct {
	mu         sync.Mutex
	deliveries int            // records handed to the consumers
	seen       map[string]int // value -> times delivered
	errs       []error        // fetch errors the consumers saw
}

// consumeShare runs members share consumers of group bootstrapped at
// addr until n distinct records were read or within passes; every
// record is accepted (acknowledged on the next poll).
func consumeShare(t *testing.T, addr, group, topic string, members, n int, within time.Duration) *shareRun {
	t.Helper()
	run := &shareRun{seen: make(map[string]int)}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var wg sync.WaitGroup
	done := make(chan struct{})
	var once sync.Once
	for i := range members {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ClientID("share-"+strconv.Itoa(i)),
			kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for {
				select {
				case <-done:
					return
				default:
				}
				fs := cl.PollFetches(ctx)
				if ctx.Err() != nil {
					return
				}
				run.mu.Lock()
				fs.EachError(func(_ string, _ int32, err error) { run.errs = append(run.errs, err) })
				fs.EachRecord(func(r *kgo.Record) {
					run.deliveries++
					run.seen[string(r.Value)]++
				})
				enough := len(run.seen) >= n
				run.mu.Unlock()
				if enough {
					once.Do(func() { close(done) })
				}
			}
		}()
	}
	wg.Wait()
	return run
}

// TestShareGroupsThroughKproxy: two share consumers of one group read
// every record through kproxy, in local mode and in a fleet, as two
// read them directly in the same run; the group lives on the cluster
// (kproxy's engine never serves it), kproxy's admin API lists it as a
// forwarded share group, and ListGroups and the share admin APIs through
// kproxy answer as the cluster does.
func TestShareGroupsThroughKproxy(t *testing.T) {
	for _, mode := range []kproxy.GroupsMode{kproxy.GroupsLocal, kproxy.GroupsDistributed, kproxy.GroupsForward} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			s := newStack(t, func(c *kproxy.Config) {
				c.Groups.Mode = mode
				c.Groups.Fleet.Name = "share-" + string(mode)
				c.AdminListen = "127.0.0.1:0"
			})
			const n = 600
			topic := "share-t-" + string(mode)
			direct, through := "share-direct-"+string(mode), "share-kproxy-"+string(mode)
			dcl := directClient(t, s)
			for _, g := range []string{direct, through} {
				setShareReset(ctx, t, dcl, g)
			}
			// Records on every partition, so that reading them all
			// fetches each partition and the cluster keeps a share
			// state for each (kfake makes one at a partition's first
			// fetch; a partition left empty by the sticky partitioner
			// may never be fetched before the consumers stop, and the
			// describe below lists it on neither path).
			s.produceEvenly(ctx, topic, 3, n)

			d := consumeShare(t, s.cluster.ListenAddrs()[0], direct, topic, 2, n, 30*time.Second)
			k := consumeShare(t, s.addr(), through, topic, 2, n, 30*time.Second)
			for name, r := range map[string]*shareRun{"directly": d, "through kproxy": k} {
				if len(r.seen) != n {
					t.Errorf("%s: %d of %d records read (%d deliveries, errors %v)", name, len(r.seen), n, r.deliveries, r.errs)
				}
			}
			// Redeliveries are the cluster's business and vary from run
			// to run on either path (kfake: 600 to 1100 deliveries of 600,
			// directly as through kproxy); the exact semantics are
			// TestShareAcksThroughKproxy's.
			t.Logf("deliveries: directly %d, through kproxy %d (of %d records)", d.deliveries, k.deliveries, n)
			if s.engine != nil {
				for _, g := range s.engine.Groups() {
					if g.Group == through {
						t.Errorf("kproxy's engine holds share group %s (%+v)", through, g)
					}
				}
			}

			if mode == kproxy.GroupsForward {
				// kproxy serves no group at all: nothing to list as
				// forwarded.
				checkShareListAndOffsets(ctx, t, dcl, s.client(), direct, through)
				return
			}
			// The admin API names it as a share group the cluster serves.
			var fw struct{ Groups []tap.ForwardedGroup }
			resp, err := http.Get("http://" + s.kproxy.AdminAddr() + "/api/forwarded")
			if err != nil {
				t.Fatal(err)
			}
			err = json.NewDecoder(resp.Body).Decode(&fw)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, g := range fw.Groups {
				found = found || (g.Group == through && g.Kind == "share")
			}
			if !found {
				t.Errorf("/api/forwarded lacks share group %s: %+v", through, fw.Groups)
			}
			mresp, err := http.Get("http://" + s.kproxy.AdminAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			metrics, err := io.ReadAll(mresp.Body)
			mresp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`(?m)^kproxy_groups_forwarded\{[^}]*kproxy_group_kind="share"[^}]*\} [1-9]`).Match(metrics) {
				t.Errorf("/metrics has no kproxy_groups_forwarded gauge for share groups:\n%s", grepLines(string(metrics), "forwarded"))
			}

			checkShareListAndOffsets(ctx, t, dcl, s.client(), direct, through)
		})
	}
}

// checkShareListAndOffsets: ListGroups of share groups and
// DescribeShareGroupOffsets through kproxy (kcl) answer as directly (dcl).
func checkShareListAndOffsets(ctx context.Context, t *testing.T, dcl, kcl *kgo.Client, direct, through string) {
	t.Helper()
	for _, cl := range []*kgo.Client{dcl, kcl} {
		lreq := kmsg.NewPtrListGroupsRequest()
		lreq.TypesFilter = []string{"share"}
		lresp, err := lreq.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, g := range lresp.Groups {
			listed[g.Group] = true
		}
		if !listed[direct] || !listed[through] || len(lresp.Groups) != 2 {
			t.Errorf("ListGroups of share groups: %+v, want %s and %s", lresp.Groups, direct, through)
		}
	}
	offsets := func(cl *kgo.Client, group string) map[int32]int64 {
		req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
		g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
		g.GroupID = group
		req.Groups = append(req.Groups, g)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("DescribeShareGroupOffsets %s: %v", group, err)
		}
		out := map[int32]int64{}
		for _, g := range resp.Groups {
			if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
				t.Fatalf("DescribeShareGroupOffsets %s: %v", group, err)
			}
			for _, tp := range g.Topics {
				for _, p := range tp.Partitions {
					out[p.Partition] = p.StartOffset
				}
			}
		}
		return out
	}
	if got, want := offsets(kcl, through), offsets(dcl, through); len(got) != 3 || !equalOffsets(got, want) {
		t.Errorf("share offsets of %s through kproxy %v, directly %v", through, got, want)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func equalOffsets(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for p, o := range a {
		if b[p] != o {
			return false
		}
	}
	return true
}

// TestOneGroupWhateverItsKind: a group id is one group, whatever its
// kind, through kproxy as directly. A share heartbeat for a consumer
// group kproxy serves gets the error the cluster gives for the same mix
// directly, and a classic member joining an id that is a share group
// on the cluster gets the cluster's own answer; kproxy never makes a
// second group of the name.
func TestOneGroupWhateverItsKind(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const topic = "kinds-t"
	s.produce(ctx, topic, 2, 10)
	dcl, kcl := directClient(t, s), s.client()

	// A consumer group with a member, directly and through kproxy; then
	// a share heartbeat for each.
	ownD, ownK := newOwnership(t), newOwnership(t)
	startMemberAt(t, s.cluster.ListenAddrs()[0], "cd", memberCfg{group: "kinds-consumer-direct", topic: topic, own: ownD, recs: newRecords(),
		opts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}})
	s.startMember("ck", memberCfg{group: "kinds-consumer-kproxy", topic: topic, own: ownK, recs: newRecords()})
	waitOwners(t, ownD, 2, "cd")
	waitOwners(t, ownK, 2, "ck")
	shareBeat := func(cl *kgo.Client, group string) (int16, string) {
		req := kmsg.NewPtrShareGroupHeartbeatRequest()
		req.GroupID, req.MemberID, req.MemberEpoch = group, "m-"+group, 0
		req.SubscribedTopicNames = []string{topic}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("ShareGroupHeartbeat %s: %v", group, err)
		}
		msg := ""
		if resp.ErrorMessage != nil {
			msg = *resp.ErrorMessage
		}
		return resp.ErrorCode, msg
	}
	dc, dm := shareBeat(dcl, "kinds-consumer-direct")
	kc, km := shareBeat(kcl, "kinds-consumer-kproxy")
	t.Logf("share heartbeat for a consumer group: directly %v %q, through kproxy %v %q", kerr.ErrorForCode(dc), dm, kerr.ErrorForCode(kc), km)
	if dc == 0 {
		t.Fatalf("directly, a share heartbeat for a live consumer group succeeded: the cluster mixes kinds, this test proves nothing")
	}
	if kc != dc {
		t.Errorf("share heartbeat for a consumer group: through kproxy %v %q, directly %v %q", kerr.ErrorForCode(kc), km, kerr.ErrorForCode(dc), dm)
	}

	// A share group on the cluster, made through kproxy; then a classic
	// member's JoinGroup for it, directly and through kproxy.
	for _, g := range []string{"kinds-share"} {
		setShareReset(ctx, t, dcl, g)
	}
	if r := consumeShare(t, s.addr(), "kinds-share", topic, 1, 10, 20*time.Second); len(r.seen) != 10 {
		t.Fatalf("share group through kproxy read %d of 10 records (errors %v)", len(r.seen), r.errs)
	}
	join := func(cl *kgo.Client) int16 {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.ProtocolType = "kinds-share", "consumer"
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 6000, 6000
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "range", (&kmsg.ConsumerMemberMetadata{Topics: []string{topic}}).AppendTo(nil)
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("JoinGroup kinds-share: %v", err)
		}
		return resp.ErrorCode
	}
	dj, kj := join(dcl), join(kcl)
	t.Logf("classic JoinGroup for a share group: directly %v, through kproxy %v", kerr.ErrorForCode(dj), kerr.ErrorForCode(kj))
	if dj == 0 || dj == kerr.MemberIDRequired.Code {
		t.Fatalf("directly, a classic JoinGroup for a share group was accepted (%v): this test proves nothing", kerr.ErrorForCode(dj))
	}
	if kj != dj {
		t.Errorf("classic JoinGroup for a share group: through kproxy %v, directly %v", kerr.ErrorForCode(kj), kerr.ErrorForCode(dj))
	}
	for _, g := range s.engine.Groups() {
		if g.Group == "kinds-share" {
			t.Errorf("kproxy's engine made a group of share group kinds-share's name: %+v", g)
		}
	}
}

// shareAcks is what one share consumer saw of acknowledgements.
type shareAcks struct {
	firstRelease map[string]bool  // values released on their first delivery
	rejected     map[string]bool  // values rejected
	deliveries   map[string][]int // value -> the delivery counts it came with
}

// ackShare reads n records of group at addr with one franz-go share
// consumer that rejects every third value, releases the next one on its
// first delivery (accepting it when it comes again) and accepts the rest,
// until every value was accepted or rejected.
func ackShare(t *testing.T, addr, group, topic string, n int) *shareAcks {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	a := &shareAcks{firstRelease: map[string]bool{}, rejected: map[string]bool{}, deliveries: map[string][]int{}}
	done := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(done) < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			v := string(r.Value)
			i, _ := strconv.Atoi(strings.TrimPrefix(v, "v"))
			a.deliveries[v] = append(a.deliveries[v], int(r.DeliveryCount()))
			switch {
			case i%3 == 0:
				r.Ack(kgo.AckReject)
				a.rejected[v] = true
				done[v] = true
			case i%3 == 1 && r.DeliveryCount() == 1:
				r.Ack(kgo.AckRelease)
				a.firstRelease[v] = true
			default:
				r.Ack(kgo.AckAccept)
				done[v] = true
			}
		})
	}
	if err := cl.FlushAcks(context.Background()); err != nil {
		t.Errorf("flushing acks of %s: %v", group, err)
	}
	if len(done) < n {
		t.Fatalf("share group %s at %s: %d of %d records settled in 30s", group, addr, len(done), n)
	}
	// Rejected records are never delivered again (KIP-932: Archived).
	extra, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	for extra.Err() == nil {
		cl.PollFetches(extra).EachRecord(func(r *kgo.Record) {
			a.deliveries[string(r.Value)] = append(a.deliveries[string(r.Value)], int(r.DeliveryCount()))
		})
	}
	return a
}

// TestShareAcksThroughKproxy: the cluster's delivery semantics reach a
// share consumer through kproxy as directly: a released record comes
// back with delivery count 2, a rejected one never again, an accepted one
// once.
func TestShareAcksThroughKproxy(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	const topic, n = "share-acks-t", 60
	dcl := directClient(t, s)
	for _, g := range []string{"share-acks-direct", "share-acks-kproxy"} {
		setShareReset(ctx, t, dcl, g)
	}
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("v%03d", i))})
	}
	s.produce(ctx, topic, 2, 0)
	if err := dcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	d := ackShare(t, s.cluster.ListenAddrs()[0], "share-acks-direct", topic, n)
	k := ackShare(t, s.addr(), "share-acks-kproxy", topic, n)
	for name, a := range map[string]*shareAcks{"directly": d, "through kproxy": k} {
		for i := range n {
			v := fmt.Sprintf("v%03d", i)
			got := a.deliveries[v]
			var want []int
			switch i % 3 {
			case 0:
				want = []int{1} // rejected: archived
			case 1:
				want = []int{1, 2} // released once, then accepted
			default:
				want = []int{1}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s delivered with counts %v, want %v", name, v, got, want)
			}
		}
	}
}
