package share

import (
	"math"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestSessionEpochs(t *testing.T) {
	c := NewSessions(2)
	p0, p1, p2 := tps(1, 0)[0], tps(1, 1)[0], tps(2, 0)[0]

	if _, code := c.Update("g", "m", 1, nil, nil); code != kerr.ShareSessionNotFound.Code {
		t.Fatalf("no session, epoch 1: %d", code)
	}
	if _, code := c.Update("g", "m", -1, nil, nil); code != kerr.ShareSessionNotFound.Code {
		t.Fatalf("no session, epoch -1: %d", code)
	}
	s, code := c.Update("g", "m", 0, []TopicPartition{p0, p1}, nil)
	if code != 0 || s.Epoch != 1 || !reflect.DeepEqual(s.Partitions(), []TopicPartition{p0, p1}) {
		t.Fatalf("open: %d %+v", code, s)
	}
	if _, code := c.Update("g", "m", 2, nil, nil); code != kerr.InvalidShareSessionEpoch.Code {
		t.Fatalf("wrong epoch: %d", code)
	}
	// A wrong epoch changes nothing; the right one adds then forgets.
	s, code = c.Update("g", "m", 1, []TopicPartition{p2, p0}, []TopicPartition{p0})
	if code != 0 || s.Epoch != 2 || !reflect.DeepEqual(s.Partitions(), []TopicPartition{p1, p2}) || s.Contains(p0) {
		t.Fatalf("incremental: %d %+v", code, s)
	}
	// Epoch 0 again replaces the session.
	s, code = c.Update("g", "m", 0, []TopicPartition{p2}, nil)
	if code != 0 || s.Epoch != 1 || !reflect.DeepEqual(s.Partitions(), []TopicPartition{p2}) || c.Len() != 1 {
		t.Fatalf("reopen: %d %+v", code, s)
	}
	// Close returns the removed session.
	s, code = c.Update("g", "m", -1, nil, nil)
	if code != 0 || s == nil || s.Epoch != FinalEpoch || c.Len() != 0 || c.Get("g", "m") != nil {
		t.Fatalf("close: %d %+v", code, s)
	}
}

func TestSessionLimit(t *testing.T) {
	c := NewSessions(2)
	for _, m := range []string{"a", "b"} {
		if _, code := c.Update("g", m, 0, nil, nil); code != 0 {
			t.Fatal(code)
		}
	}
	if _, code := c.Update("g", "c", 0, nil, nil); code != kerr.ShareSessionLimitReached.Code {
		t.Fatalf("third session: %d", code)
	}
	// A member re-opening its own session is not refused.
	if _, code := c.Update("g", "a", 0, nil, nil); code != 0 {
		t.Fatalf("reopen at the limit: %d", code)
	}
	// The same member id in another group is another session.
	if _, code := c.Update("h", "a", 0, nil, nil); code != kerr.ShareSessionLimitReached.Code {
		t.Fatalf("other group at the limit: %d", code)
	}
	if c.Remove("g", "b") == nil || c.Remove("g", "b") != nil {
		t.Fatal("remove")
	}
	if _, code := c.Update("g", "c", 0, nil, nil); code != 0 {
		t.Fatalf("after remove: %d", code)
	}
}

func TestSessionEpochWraps(t *testing.T) {
	if nextEpoch(math.MaxInt32) != 1 || nextEpoch(5) != 6 || nextEpoch(-1) != -1 {
		t.Fatal("nextEpoch")
	}
	c := NewSessions(0)
	s, _ := c.Update("g", "m", 0, nil, nil)
	s.Epoch = math.MaxInt32
	if s, code := c.Update("g", "m", math.MaxInt32, nil, nil); code != 0 || s.Epoch != 1 {
		t.Fatalf("wrap: %d %+v", code, s)
	}
}
