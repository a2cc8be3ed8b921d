package groupconfig

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// describeConfigsFake answers DescribeConfigs for GROUP resources from
// configs (group -> name -> value), refusing the groups in refused with
// GROUP_AUTHORIZATION_FAILED, or every resource with code when it is set;
// asked records the groups of each request.
type describeConfigsFake struct {
	mu      sync.Mutex
	configs map[string]map[string]string
	refused map[string]bool
	code    int16
	err     error // the request fails
	asked   [][]string
}

func (f *describeConfigsFake) Request(_ context.Context, req kmsg.Request) (kmsg.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	q := req.(*kmsg.DescribeConfigsRequest)
	resp := q.ResponseKind().(*kmsg.DescribeConfigsResponse)
	var asked []string
	for _, r := range q.Resources {
		asked = append(asked, r.ResourceName)
		rr := kmsg.NewDescribeConfigsResponseResource()
		rr.ResourceType, rr.ResourceName = r.ResourceType, r.ResourceName
		switch {
		case f.code != 0:
			rr.ErrorCode = f.code
		case f.refused[r.ResourceName]:
			rr.ErrorCode = kerr.GroupAuthorizationFailed.Code
		default:
			for _, name := range r.ConfigNames {
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Source, c.Value = name, kmsg.ConfigSourceDefaultConfig, kmsg.StringPtr("1")
				if v, ok := f.configs[r.ResourceName][name]; ok {
					c.Source, c.Value = kmsg.ConfigSourceGroupConfig, kmsg.StringPtr(v)
				}
				rr.Configs = append(rr.Configs, c)
			}
		}
		resp.Resources = append(resp.Resources, rr)
	}
	f.asked = append(f.asked, asked)
	return resp, nil
}

// TestGroupConfigsReads: only values set on the group count; a group the
// cluster refuses to describe keeps the engine's settings and is not
// asked again with every new group; a cluster without GROUP configs is
// not asked again at all.
func TestGroupConfigsReads(t *testing.T) {
	ctx := context.Background()
	f := &describeConfigsFake{
		configs: map[string]map[string]string{"a": {"consumer.session.timeout.ms": "50000"}},
		refused: map[string]bool{"b": true},
	}
	gc := NewConfigs(f, 0, nil)
	gc.Get("a")
	gc.Get("b")
	if !gc.readOnce(ctx, false) {
		t.Fatal("the cluster's answer turned group configs off")
	}
	if got := gc.Get("a"); got != (groupstate.GroupSettings{ConsumerSessionTimeout: 50 * time.Second}) {
		t.Fatalf("group a: %+v, want its own 50s session and no interval (the default-sourced value is not the group's)", got)
	}
	if got := gc.Get("b"); got != (groupstate.GroupSettings{}) {
		t.Fatalf("refused group b: %+v, want the engine's", got)
	}
	gc.Get("c")
	gc.readOnce(ctx, false)
	if last := f.asked[len(f.asked)-1]; len(last) != 1 || last[0] != "c" {
		t.Fatalf("a new group's read asked for %v, want [c] alone", last)
	}
	gc.readOnce(ctx, true) // the refresh asks for every group, b included
	if last := f.asked[len(f.asked)-1]; len(last) != 3 {
		t.Fatalf("the refresh asked for %v, want a, b and c", last)
	}

	off := &describeConfigsFake{code: kerr.InvalidRequest.Code}
	gc = NewConfigs(off, 0, nil)
	gc.Get("a")
	if gc.readOnce(ctx, false) {
		t.Fatal("a cluster answering INVALID_REQUEST for GROUP resources left group configs on")
	}
	gc.Get("d")
	if n := len(off.asked); n != 1 {
		t.Fatalf("%d requests, want the first alone", n)
	}
}

// TestGroupConfigsFirstRead: a joining member's wait (unread) ends with
// the group's first read, whatever it found, and no join waits once the
// group was read, while the reads fail, or on a cluster without GROUP
// configs.
func TestGroupConfigsFirstRead(t *testing.T) {
	ctx := context.Background()
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	f := &describeConfigsFake{
		configs: map[string]map[string]string{"a": {"consumer.heartbeat.interval.ms": "1500"}},
		refused: map[string]bool{"b": true},
	}
	gc := NewConfigs(f, 0, nil)
	a, b := gc.Unread("a"), gc.Unread("b")
	if a == nil || b == nil || closed(a) || closed(b) {
		t.Fatal("groups never read: a join must wait for their first read")
	}
	if again := gc.Unread("a"); again != a {
		t.Fatal("a second join of the same unread group must wait for the same read")
	}
	gc.readOnce(ctx, false)
	if !closed(a) || !closed(b) {
		t.Fatal("the first read, a refusal included, must end the joins' wait")
	}
	if gc.Unread("a") != nil || gc.Unread("b") != nil {
		t.Fatal("a group read once must not make joins wait")
	}
	if got := gc.Get("a").ConsumerHeartbeatInterval; got != 1500*time.Millisecond {
		t.Fatalf("group a's interval %v after its first read, want 1.5s", got)
	}

	f.err = context.DeadlineExceeded
	c := gc.Unread("c")
	gc.readOnce(ctx, false)
	if closed(c) {
		t.Fatal("a failed read is no read: the join's wait ends at its bound")
	}
	if gc.Unread("d") != nil {
		t.Fatal("while the reads fail, joins must not wait")
	}
	f.err = nil
	gc.readOnce(ctx, false)
	if !closed(c) {
		t.Fatal("the read after the failure must end the wait of c")
	}

	off := &describeConfigsFake{code: kerr.InvalidRequest.Code}
	gc = NewConfigs(off, 0, nil)
	e := gc.Unread("e")
	gc.readOnce(ctx, false)
	if !closed(e) {
		t.Fatal("a cluster without GROUP configs must end the joins' wait")
	}
	if gc.Unread("f") != nil {
		t.Fatal("a cluster without GROUP configs must not make joins wait")
	}
}

// TestShareAutoOffsetResetSetting: the engine gets a group's
// share.auto.offset.reset when it is earliest, latest or any by_duration
// value (one that does not parse is logged where it would apply), and
// Kafka's default (latest, the zero value) for anything else.
func TestShareAutoOffsetResetSetting(t *testing.T) {
	for value, want := range map[string]string{
		"earliest":            "earliest",
		"latest":              "latest",
		"by_duration:PT1H":    "by_duration:PT1H",
		" by_duration:P1D ":   "by_duration:P1D",
		"by_duration:not-iso": "by_duration:not-iso",
		"middle":              "",
		"BY_DURATION:PT1H":    "",
	} {
		if got := settingsOf(map[string]string{"share.auto.offset.reset": value}).Share.AutoOffsetReset; got != want {
			t.Errorf("share.auto.offset.reset=%q: the engine gets %q, want %q", value, got, want)
		}
	}
}
