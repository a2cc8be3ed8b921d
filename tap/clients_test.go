package tap_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap"
	"github.com/kproxy/kproxy/tap/internal/devstack"
)

// rebalanceRoots returns the root spans of group's rebalances in end
// order.
func rebalanceRoots(spans tracetest.SpanStubs, group string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "rebalance" && attr(s, "messaging.consumer.group.name") == group {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// memberEvent finds a span event of kind whose messaging.client.id is
// client.
func hasMemberEvent(s tracetest.SpanStub, kind, client string) bool {
	for _, e := range s.Events {
		if e.Name != kind {
			continue
		}
		for _, kv := range e.Attributes {
			if kv.Key == "messaging.client.id" && kv.Value.AsString() == client {
				return true
			}
		}
	}
	return false
}

// TestRebalanceTracesFromRealClients runs franz-go consumers through an
// in-process kproxy (kfake cluster, proxy, engine) and checks the trace
// of each rebalance they cause: a join, a second join, a leave and the
// expiry of a static member that vanished.
func TestRebalanceTracesFromRealClients(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Options{SpanExporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st.Close(c)
	})
	const group, topic = "orders", "payments"
	if err := st.CreateTopic(ctx, topic, 6); err != nil {
		t.Fatal(err)
	}
	if err := st.Produce(ctx, topic, 120); err != nil {
		t.Fatal(err)
	}
	step := func(name string, members int) {
		t.Helper()
		if _, err := st.WaitGroup(ctx, group, members); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := st.Tap.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}

	c1, err := st.NewConsumer(group, "c1", []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	step("c1 joins", 1)
	c2, err := st.NewConsumer(group, "c2", []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	step("c2 joins", 2)
	c2.Close()
	step("c2 leaves", 1)
	c3, err := st.NewConsumer(group, "c3", []string{topic},
		kgo.InstanceID("c3-static"), kgo.SessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	step("c3 joins", 2)
	c3.Close() // a static member does not leave: its session expires
	step("c3 expires", 1)

	roots := rebalanceRoots(exp.GetSpans(), group)
	want := []struct {
		cause, kind, client string
	}{
		{groupstate.CauseMemberJoined, "member_joined", "c1"},
		{groupstate.CauseMemberJoined, "member_joined", "c2"},
		{groupstate.CauseMemberLeft, "member_left", "c2"},
		{groupstate.CauseMemberJoined, "member_joined", "c3"},
		{groupstate.CauseMemberExpired, "member_expired", "c3"},
	}
	// Clients may add rebalances of their own; the expected ones must
	// appear in order.
	i := 0
	for _, r := range roots {
		if i < len(want) && attr(r, "kproxy.rebalance.cause") == want[i].cause && hasMemberEvent(r, want[i].kind, want[i].client) {
			if r.Status.Code != codes.Ok {
				t.Errorf("rebalance %d (%s) status %v", i, want[i].cause, r.Status)
			}
			if attr(r, "kproxy.rebalance.cause.client.id") != want[i].client {
				t.Errorf("rebalance %d: causing client %q, want %q", i, attr(r, "kproxy.rebalance.cause.client.id"), want[i].client)
			}
			kids := 0
			for _, s := range exp.GetSpans() {
				if s.Parent.SpanID() == r.SpanContext.SpanID() && (s.Name == "join" || s.Name == "sync") {
					kids++
				}
			}
			if kids != 2 {
				t.Errorf("rebalance %d (%s) has %d join/sync children, want 2", i, want[i].cause, kids)
			}
			i++
		}
	}
	if i != len(want) {
		var got []string
		for _, r := range roots {
			got = append(got, attr(r, "kproxy.rebalance.cause")+"/"+attr(r, "kproxy.rebalance.cause.client.id"))
		}
		t.Fatalf("found %d of %d expected rebalances in order; traces: %v", i, len(want), got)
	}
	last := roots[len(roots)-1]
	if attr(last, "kproxy.group.member_count") != "1" || attr(last, "kproxy.group.protocol_type") != "consumer" {
		t.Errorf("last rebalance attributes %v", last.Attributes)
	}

	// The admin API reports the surviving member and real lag through
	// the proxy.
	deadline := time.Now().Add(30 * time.Second)
	for {
		d := groupDetail(t, st.AdminURL+"/api/groups/"+group)
		ok := len(d.Members) == 1 && d.Members[0].ClientID == "c1" && len(d.Members[0].Assignment) == 1 &&
			len(d.Members[0].Assignment[0].Partitions) == 6 && len(d.Offsets) == 6 && d.TotalLag == 0
		for _, o := range d.Offsets {
			ok = ok && o.Committed == o.End && o.End > 0
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group detail never showed c1 with 6 partitions and no lag: %+v", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func groupDetail(t *testing.T, url string) tap.GroupDetail {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var d tap.GroupDetail
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v: %s", url, err, b)
	}
	return d
}
