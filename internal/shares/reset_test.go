package shares

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
)

// lockedBuffer is a log destination safe for the service's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// TestInitializeStartsByReset: the start offsets initialize hands the
// engine for a topic new to a group, by share.auto.offset.reset, against
// an in-memory cluster whose partitions hold records two hours old, then
// half an hour old (0), only old ones (1), or none (2): earliest the
// log's start, latest its end, by_duration the first record at most that
// old or the end where none is, a by_duration reaching before 1970 the
// log's start (a negative ListOffsets timestamp would ask for a special
// offset), and a value that does not parse latest, logged once per value.
// A topic the group reads already starts at the log's start whatever the
// setting.
func TestInitializeStartsByReset(t *testing.T) {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	newClient := func() (*kgo.Client, error) {
		return kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	cl, err := newClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const topic = "reset"
	created, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, topic)
	if err != nil {
		t.Fatal(err)
	}
	old, recent := time.Now().Add(-2*time.Hour), time.Now().Add(-30*time.Minute)
	for _, w := range []struct {
		partition int32
		ts        time.Time
		n         int
	}{{0, old, 3}, {0, recent, 2}, {1, old, 2}} {
		for i := range w.n {
			r := &kgo.Record{Topic: topic, Partition: w.partition, Value: fmt.Appendf(nil, "%d", i), Timestamp: w.ts}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}

	ops := &recordingOps{}
	logs := &lockedBuffer{}
	s, err := New(Config{Engine: ops, NewClient: newClient, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tps := []groupstate.ShareTP{{TopicID: created.ID, Partition: 0}, {TopicID: created.ID, Partition: 1}, {TopicID: created.ID, Partition: 2}}
	starts := func(s0, s1, s2 int64) map[int32]int64 { return map[int32]int64{0: s0, 1: s1, 2: s2} }
	for _, tc := range []struct {
		reset     string
		fromStart bool
		want      map[int32]int64
		badLogs   int // "does not parse" lines logged so far
	}{
		{reset: "earliest", want: starts(0, 0, 0)},
		{reset: "latest", want: starts(5, 2, 0)},
		{reset: "by_duration:PT1H", want: starts(3, 2, 0)},
		{reset: "by_duration:PT3H", want: starts(0, 0, 0)},
		{reset: "by_duration:PT0S", want: starts(5, 2, 0)},
		{reset: "by_duration:P200000D", want: starts(0, 0, 0)},
		{reset: "by_duration:PT1H", fromStart: true, want: starts(0, 0, 0)},
		{reset: "by_duration:soon", want: starts(5, 2, 0), badLogs: 1},
		{reset: "by_duration:soon", want: starts(5, 2, 0), badLogs: 1},
		{reset: "by_duration:later", want: starts(5, 2, 0), badLogs: 2},
	} {
		plan := groupstate.SharePlan{Uninitialized: tps, Settings: groupstate.ShareSettings{AutoOffsetReset: tc.reset}}
		if tc.fromStart {
			plan.FromLogStart = map[groupstate.ShareTP]bool{tps[0]: true, tps[1]: true, tps[2]: true}
		}
		before := len(ops.recorded())
		_ = s.initialize("g", plan) // recordingOps answers NOT_COORDINATOR; the starts it was handed count
		calls := ops.recorded()[before:]
		if len(calls) != 1 {
			t.Fatalf("%s (from the log's start %v): %d engine calls, want one ShareInitialize", tc.reset, tc.fromStart, len(calls))
		}
		got := map[int32]int64{}
		for tp, o := range calls[0].(initCall).starts {
			got[tp.Partition] = o
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s (from the log's start %v): starts by partition %v, want %v", tc.reset, tc.fromStart, got, tc.want)
		}
		if n := logs.count("does not parse"); n != tc.badLogs {
			t.Errorf("%s: %d warnings that it does not parse so far, want %d", tc.reset, n, tc.badLogs)
		}
	}
}
