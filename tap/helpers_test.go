package tap

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
)

// noEnv isolates exporter selection from the test process environment.
func noEnv(string) string { return "" }

// newTestTap returns a Tap exporting spans synchronously to an in-memory
// exporter, shut down at cleanup.
func newTestTap(t *testing.T, cfg Config) (*Tap, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	if cfg.SpanExporter == nil {
		cfg.SpanExporter = exp
	}
	cfg.SyncExport = true
	if cfg.Getenv == nil {
		cfg.Getenv = noEnv
	}
	tp, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tp, exp
}

// flush waits for tp to process every queued event.
func flush(t *testing.T, tp *Tap) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// eventSeq builds synthetic engine event sequences with advancing time.
type eventSeq struct {
	group string
	now   time.Time
}

func newSeq(group string) *eventSeq {
	return &eventSeq{group: group, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// at advances the sequence clock by d and returns an event of kind.
func (s *eventSeq) at(d time.Duration, kind groupstate.EventKind) groupstate.Event {
	s.now = s.now.Add(d)
	return groupstate.Event{Time: s.now, Kind: kind, Group: s.group, ProtocolType: "consumer"}
}

// member returns a member with recognisable fields.
func member(id string) groupstate.Member {
	return groupstate.Member{MemberID: id, ClientID: "client-" + id, ClientHost: "10.0.0." + id[len(id)-1:], InstanceID: ""}
}

// assignment encodes a consumer-protocol assignment.
func assignment(topic string, parts ...int32) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	a.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: topic, Partitions: parts}}
	return a.AppendTo(nil)
}

// spansByName indexes ended spans by name; names seen more than once keep
// every span in order.
func spansByName(spans tracetest.SpanStubs) map[string][]tracetest.SpanStub {
	m := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		m[s.Name] = append(m[s.Name], s)
	}
	return m
}

// attrMap flattens attributes for lookups.
func attrMap(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// wantAttr fails unless kvs holds key with the value want (compared by
// its Emit form).
func wantAttr(t *testing.T, what string, kvs []attribute.KeyValue, key, want string) {
	t.Helper()
	v, ok := attrMap(kvs)[key]
	if !ok {
		t.Errorf("%s: attribute %s missing (have %v)", what, key, kvs)
		return
	}
	if got := v.String(); got != want {
		t.Errorf("%s: attribute %s = %q, want %q", what, key, got, want)
	}
}

// eventsNamed returns the span events with the given name.
func eventsNamed(s tracetest.SpanStub, name string) []sdktrace.Event {
	var out []sdktrace.Event
	for _, e := range s.Events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// fakeGroups is a GroupSource serving fixed snapshots.
type fakeGroups struct {
	mu     sync.Mutex // guards groups
	groups []groupstate.GroupSnapshot
}

func (f *fakeGroups) Groups() []groupstate.GroupSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]groupstate.GroupSnapshot(nil), f.groups...)
}

func (f *fakeGroups) Group(id string) (groupstate.GroupSnapshot, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.groups {
		if g.Group == id {
			return g, true
		}
	}
	return groupstate.GroupSnapshot{}, false
}
