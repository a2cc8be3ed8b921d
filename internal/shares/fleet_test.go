package shares

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
)

// recordingOps is an Ops that records what it was asked and answers
// with fixed values.
type recordingOps struct {
	mu    sync.Mutex
	calls []any // guarded by mu

	plan     groupstate.SharePlan
	acquired map[groupstate.ShareTP][]share.Acquired
}

func (o *recordingOps) record(c any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, c)
}

func (o *recordingOps) recorded() []any {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]any(nil), o.calls...)
}

type prepareCall struct {
	group, member string
	acks          map[groupstate.ShareTP][]share.AckBatch
	fetch         []groupstate.ShareTP
}

type initCall struct {
	group   string
	starts  map[groupstate.ShareTP]int64
	advance bool
}

type acquireCall struct {
	group, member         string
	fetched               map[groupstate.ShareTP]groupstate.ShareFetched
	maxRecords, batchSize int
	mode                  share.AcquireMode
}

type releaseCall struct {
	group, member string
	parts         []groupstate.ShareTP
}

func (o *recordingOps) SharePrepare(group, member string, acks map[groupstate.ShareTP][]share.AckBatch, fetch []groupstate.ShareTP, done func(groupstate.SharePlan)) {
	o.record(prepareCall{group, member, acks, fetch})
	done(o.plan)
}

func (o *recordingOps) ShareInitialize(group string, starts map[groupstate.ShareTP]int64, done func(int16)) {
	o.record(initCall{group, starts, false})
	done(kerr.NotCoordinator.Code)
}

func (o *recordingOps) ShareAcquire(group, member string, fetched map[groupstate.ShareTP]groupstate.ShareFetched, maxRecords int, mode share.AcquireMode, batchSize int, done func(map[groupstate.ShareTP][]share.Acquired, int16)) {
	o.record(acquireCall{group, member, fetched, maxRecords, batchSize, mode})
	done(o.acquired, 0)
}

func (o *recordingOps) ShareAdvance(group string, logStarts map[groupstate.ShareTP]int64) {
	o.record(initCall{group, logStarts, true})
}

func (o *recordingOps) ShareReleaseMember(group, member string, parts []groupstate.ShareTP) {
	o.record(releaseCall{group, member, parts})
}

// loopback is the peer wire of a fleet of two in one process: messages
// for a group go to the handlers over owner.
type loopback struct{ owner Ops }

func (l loopback) SendPeer(ctx context.Context, _, kind string, version int16, payload []byte) ([]byte, error) {
	return PeerHandler(l.owner, kind)(ctx, version, payload)
}

// fixedLocator says every group is owned at one place (local, remote
// at an address, or nowhere).
type fixedLocator struct{ local, ok bool }

func (f fixedLocator) Locate(string) (bool, string, bool) { return f.local, "127.0.0.1:1", f.ok }
func (f fixedLocator) Changed() <-chan struct{}           { return nil }
func (f fixedLocator) Peers() []string                    { return nil }

func TestRoutedStepsReachTheOwnerIntact(t *testing.T) {
	tpA := groupstate.ShareTP{TopicID: [16]byte{1, 2, 3}, Partition: 4}
	tpB := groupstate.ShareTP{TopicID: [16]byte{9}, Partition: 0}
	owner := &recordingOps{
		plan: groupstate.SharePlan{
			AckCodes:      map[groupstate.ShareTP]int16{tpA: kerr.InvalidRecordState.Code},
			Offsets:       map[groupstate.ShareTP]int64{tpA: 17},
			Uninitialized: []groupstate.ShareTP{tpB},
			FromLogStart:  map[groupstate.ShareTP]bool{tpB: true},
			Settings:      groupstate.ShareSettings{LockDuration: 3 * time.Second, ReadCommitted: true, AutoOffsetReset: "earliest", DeliveryLimit: 7},
		},
		acquired: map[groupstate.ShareTP][]share.Acquired{tpA: {{First: 17, Last: 19, DeliveryCount: 2}}},
	}
	local := &recordingOps{}
	ops := Routed(local, fixedLocator{local: false, ok: true}, loopback{owner}, nil)

	acks := map[groupstate.ShareTP][]share.AckBatch{tpA: {{First: 10, Last: 12, Types: []share.AckType{share.AckAccept, share.AckGap, share.AckReject}}}}
	fetch := []groupstate.ShareTP{tpA, tpB}
	planCh := make(chan groupstate.SharePlan, 1)
	ops.SharePrepare("g", "m", acks, fetch, func(p groupstate.SharePlan) { planCh <- p })
	if got := <-planCh; !reflect.DeepEqual(got, owner.plan) {
		t.Errorf("plan %+v, want the owner's %+v", got, owner.plan)
	}

	codeCh := make(chan int16, 1)
	starts := map[groupstate.ShareTP]int64{tpB: 5}
	ops.ShareInitialize("g", starts, func(c int16) { codeCh <- c })
	if c := <-codeCh; c != kerr.NotCoordinator.Code {
		t.Errorf("initialize answered %d, want the owner's NOT_COORDINATOR", c)
	}

	fetched := map[groupstate.ShareTP]groupstate.ShareFetched{tpA: {FetchOffset: 17, Batches: []share.Batch{{Base: 17, Last: 20}, {Base: 21, Last: 21, Control: true, Aborted: true}}}}
	type acq struct {
		m    map[groupstate.ShareTP][]share.Acquired
		code int16
	}
	acqCh := make(chan acq, 1)
	ops.ShareAcquire("g", "m", fetched, 3, share.RecordLimit, 2, func(m map[groupstate.ShareTP][]share.Acquired, c int16) { acqCh <- acq{m, c} })
	if a := <-acqCh; a.code != 0 || !reflect.DeepEqual(a.m, owner.acquired) {
		t.Errorf("acquired %v (code %d), want the owner's %v", a.m, a.code, owner.acquired)
	}
	ops.ShareAdvance("g", map[groupstate.ShareTP]int64{tpA: 30})
	// Advance and release answer nothing: their messages go out on
	// their own goroutines, so one at a time.
	waitUntil(t, "the owner to see the advance", func() bool { return len(owner.recorded()) == 4 })
	ops.ShareReleaseMember("g", "m", []groupstate.ShareTP{tpB})

	want := []any{
		prepareCall{"g", "m", acks, fetch},
		initCall{"g", starts, false},
		acquireCall{"g", "m", fetched, 3, 2, share.RecordLimit},
		initCall{"g", map[groupstate.ShareTP]int64{tpA: 30}, true},
		releaseCall{"g", "m", []groupstate.ShareTP{tpB}},
	}
	waitUntil(t, "the owner to see five steps", func() bool { return len(owner.recorded()) == len(want) })
	if got := owner.recorded(); !reflect.DeepEqual(got, want) {
		t.Errorf("the owner was asked\n%+v\nwant\n%+v", got, want)
	}
	if n := len(local.recorded()); n != 0 {
		t.Errorf("the local engine was asked %d steps of a group owned elsewhere", n)
	}
}

func TestRoutedStepsOfALocalGroupStayLocal(t *testing.T) {
	owner, local := &recordingOps{}, &recordingOps{}
	ops := Routed(local, fixedLocator{local: true, ok: true}, loopback{owner}, nil)
	done := make(chan groupstate.SharePlan, 1)
	ops.SharePrepare("g", "m", nil, nil, func(p groupstate.SharePlan) { done <- p })
	<-done
	ops.ShareReleaseMember("g", "m", nil)
	if n := len(local.recorded()); n != 2 {
		t.Errorf("the local engine was asked %d steps, want 2", n)
	}
	if n := len(owner.recorded()); n != 0 {
		t.Errorf("a peer was asked %d steps of a group owned here", n)
	}
}

func TestRoutedStepWithoutOwner(t *testing.T) {
	ops := Routed(&recordingOps{}, fixedLocator{ok: false}, loopback{&recordingOps{}}, nil)
	start := time.Now()
	done := make(chan groupstate.SharePlan, 1)
	ops.SharePrepare("g", "m", nil, nil, func(p groupstate.SharePlan) { done <- p })
	if p := <-done; p.Code != kerr.CoordinatorNotAvailable.Code {
		t.Errorf("plan code %d, want COORDINATOR_NOT_AVAILABLE", p.Code)
	}
	if d := time.Since(start); d < ownerWait {
		t.Errorf("gave up after %v, before waiting %v for an owner", d, ownerWait)
	}
}

// failingPeers is a peer wire whose owner cannot be reached.
type failingPeers struct{}

func (failingPeers) SendPeer(context.Context, string, string, int16, []byte) ([]byte, error) {
	return nil, errors.New("connection reset")
}

func TestRoutedStepOwnerUnreachable(t *testing.T) {
	ops := Routed(&recordingOps{}, fixedLocator{ok: true}, failingPeers{}, nil)
	type acq struct {
		m    map[groupstate.ShareTP][]share.Acquired
		code int16
	}
	ch := make(chan acq, 1)
	ops.ShareAcquire("g", "m", nil, 1, 0, 1, func(m map[groupstate.ShareTP][]share.Acquired, c int16) { ch <- acq{m, c} })
	if a := <-ch; a.code != kerr.CoordinatorNotAvailable.Code || len(a.m) != 0 {
		t.Errorf("acquire answered %v code %d, want nothing and COORDINATOR_NOT_AVAILABLE", a.m, a.code)
	}
}

func TestPeerHandlerRefusesWhatItCannotRead(t *testing.T) {
	owner := &recordingOps{}
	ctx := context.Background()
	if _, err := PeerHandler(owner, MsgPrepare)(ctx, 0, []byte("{not json")); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed payload: %v, want ErrMalformed", err)
	}
	if _, err := PeerHandler(owner, MsgAcquire)(ctx, 1, []byte("{}")); err == nil {
		t.Error("a v1 message was served by a v0 handler")
	}
	if _, err := PeerHandler(owner, "share.unknown")(ctx, 0, []byte("{}")); err == nil {
		t.Error("an unknown type was served")
	}
	if n := len(owner.recorded()); n != 0 {
		t.Errorf("the engine was asked %d steps by messages it could not read", n)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// movingLocator names one owner until move, then another.
type movingLocator struct {
	mu      sync.Mutex
	addr    string
	changed chan struct{}
}

func (m *movingLocator) Locate(string) (bool, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return false, m.addr, true
}

func (m *movingLocator) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *movingLocator) Peers() []string { return nil }

func (m *movingLocator) move(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addr = addr
	close(m.changed)
	m.changed = make(chan struct{})
}

// holdingPeer never answers: an owner that lost the group while its
// state write hangs.
type holdingPeer struct{}

func (holdingPeer) SendPeer(ctx context.Context, _, _ string, _ int16, _ []byte) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRoutedStepAbandonedWhenTheOwnerMoves: a step the owner holds is
// failed (COORDINATOR_NOT_AVAILABLE, which the share service answers as
// a lost acknowledgement) as soon as the fleet names another owner, not
// at peerCallTimeout.
func TestRoutedStepAbandonedWhenTheOwnerMoves(t *testing.T) {
	loc := &movingLocator{addr: "127.0.0.1:1", changed: make(chan struct{})}
	r := Routed(nil, loc, holdingPeer{}, nil)
	got := make(chan groupstate.SharePlan, 1)
	start := time.Now()
	r.SharePrepare("g", "m", nil, nil, func(p groupstate.SharePlan) { got <- p })
	time.Sleep(50 * time.Millisecond)
	loc.move("127.0.0.1:2")
	select {
	case p := <-got:
		if p.Code != kerr.CoordinatorNotAvailable.Code {
			t.Errorf("plan code %d, want COORDINATOR_NOT_AVAILABLE", p.Code)
		}
		if took := time.Since(start); took > peerCallTimeout/2 {
			t.Errorf("the step failed after %v, want soon after the move", took)
		}
	case <-time.After(peerCallTimeout + time.Second):
		t.Fatal("the step held by the old owner was not failed after the move")
	}
}
