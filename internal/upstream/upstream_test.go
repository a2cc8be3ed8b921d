package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kproxy/kproxy/internal/clientpool"
)

func newCluster(t *testing.T, opts ...kfake.Opt) (*kfake.Cluster, *Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c, New(cl)
}

func offsetFetchCode(r kmsg.Response) int16 {
	resp := r.(*kmsg.OffsetFetchResponse)
	if len(resp.Groups) > 0 {
		return resp.Groups[0].ErrorCode
	}
	return resp.ErrorCode
}

// A coordinator that answers NOT_COORDINATOR twice, then serves: Request
// finds it again each time and returns the served answer; a code that is
// not about the coordinator is returned as it is, at once.
func TestRequestFollowsTheCoordinator(t *testing.T) {
	c, up := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	refused, finds := 0, 0
	c.ControlKey(int16(kmsg.FindCoordinator), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		finds++
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if refused == 2 {
			return nil, nil, false
		}
		c.KeepControl()
		refused++
		r := req.(*kmsg.OffsetFetchRequest)
		resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.Version = r.Version
		g := kmsg.NewOffsetFetchResponseGroup()
		g.Group = "g"
		g.ErrorCode = kerr.NotCoordinator.Code
		resp.Groups = append(resp.Groups, g)
		resp.ErrorCode = kerr.NotCoordinator.Code
		return resp, nil, true
	})
	req := kmsg.NewPtrOffsetFetchRequest()
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = "g"
	req.Groups = append(req.Groups, rg)
	req.Group = "g"
	resp, err := up.Request(ctx, CoordinatorGroup, "g", req, req.MaxVersion(), offsetFetchCode)
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if code := offsetFetchCode(resp); RetriableCoordinatorCode(code) {
		t.Fatalf("returned a refusal (code %d), not the served answer", code)
	}
	if refused != 2 {
		t.Fatalf("refused %d times, want 2", refused)
	}
	if finds < 3 {
		t.Fatalf("FindCoordinator asked %d times, want at least 3 (once, then after each NOT_COORDINATOR)", finds)
	}

	// Cached now: one more request asks no FindCoordinator.
	before := finds
	if _, err := up.Request(ctx, CoordinatorGroup, "g", req, req.MaxVersion(), offsetFetchCode); err != nil {
		t.Fatal(err)
	}
	if finds != before {
		t.Fatalf("FindCoordinator asked %d more times with the coordinator cached", finds-before)
	}
}

// A context that ends stops the retries with its error.
func TestRequestBoundedByContext(t *testing.T) {
	c, up := newCluster(t)
	c.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetFetchRequest)
		resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.Version = r.Version
		resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
		g := kmsg.NewOffsetFetchResponseGroup()
		g.Group, g.ErrorCode = "g", kerr.CoordinatorLoadInProgress.Code
		resp.Groups = append(resp.Groups, g)
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = "g"
	req.Groups = append(req.Groups, rg)
	req.Group = "g"
	start := time.Now()
	_, err := up.Request(ctx, CoordinatorGroup, "g", req, req.MaxVersion(), offsetFetchCode)
	if err == nil {
		t.Fatal("Request succeeded against a coordinator that is always loading")
	}
	if ctx.Err() == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Request gave up after %v with %v, before its context ended", time.Since(start), err)
	}
}

// SupportsKey and LacksKey read the cluster's ApiVersions; a key the
// cluster does not list is lacking, one it lists is supported.
func TestKeys(t *testing.T) {
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.ConsumerGroupDescribe), -1)
	_, up := newCluster(t, kfake.MaxVersions(vs))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !up.SupportsKey(ctx, int16(kmsg.OffsetCommit)) || up.LacksKey(ctx, int16(kmsg.OffsetCommit)) {
		t.Fatal("OffsetCommit not supported")
	}
	if up.SupportsKey(ctx, int16(kmsg.ConsumerGroupDescribe)) || !up.LacksKey(ctx, int16(kmsg.ConsumerGroupDescribe)) {
		t.Fatal("ConsumerGroupDescribe, taken out of the cluster's ApiVersions, is not lacking")
	}
}

// A closed pool lends the Cluster's own client (kproxy stopping: its
// last requests still go out).
func TestLendAfterPoolClosed(t *testing.T) {
	_, up := newCluster(t)
	pool := clientpool.New("test", 1, func() (*kgo.Client, error) { return kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1")) })
	up.LendFrom(pool)
	pool.Close()
	cl, put, err := up.Lend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer put()
	if cl != up.Client() {
		t.Fatal("a closed pool did not lend the Cluster's own client")
	}
}
