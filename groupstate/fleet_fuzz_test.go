package groupstate

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestFleetRandomOwnershipMoves moves the partitions of the groups topic
// at random between two engines over one FencedMemoryStore, gracefully
// (Owns false and Unload, then a claim) or not (a claim fences an owner
// that is told later), while simple groups commit ever larger offsets to
// either engine, some of them held in flight across a fencing move, and the
// members of a stable classic group heartbeat to either engine. It
// checks that a committed offset never goes backwards, that no
// acknowledged commit is lost, that the classic group never rebalances
// and that every answer is the one its engine's ownership calls for.
func TestFleetRandomOwnershipMoves(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { fleetRandomMoves(t, seed, 400) })
	}
}

func fleetRandomMoves(t *testing.T, seed uint64, steps int) {
	const parts = 4
	fs := newFencedMemoryStore(parts)
	eng := []*fleetMember{newFleetMember(t, fs, "A"), newFleetMember(t, fs, "B")}
	rng := rand.New(rand.NewPCG(seed, 0x6b70726f7879))
	// owner is the engine that claimed each partition last; zombie an
	// engine that still believes it owns it (-1: none). Both are owned
	// by this goroutine.
	owner := make([]int, parts)
	zombie := make([]int, parts)
	for p := range uint32(parts) {
		eng[0].w.claim(p)
		zombie[p] = -1
	}
	holds := make([]chan struct{}, len(eng))
	// release unloads p at engine e. Unload waits for the store calls in
	// flight, so a held write is let go first: a revoked owner lets its
	// in-flight transaction finish; a fenced one's fails.
	release := func(e int, p uint32) {
		if holds[e] != nil {
			eng[e].w.setHold(false, nil)
			close(holds[e])
			holds[e] = nil
		}
		eng[e].release(p)
	}
	claim := func(to int, p uint32) {
		if zombie[p] == to {
			// A kproxy that lost a partition drops its groups before
			// it may claim it again.
			release(to, p)
			zombie[p] = -1
		}
		eng[to].w.claim(p)
		owner[p] = to
	}
	ids, gen := eng[0].stableGroup("c", 2)
	cp := fs.partition("c")

	groups := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	next := make(map[fencedKey]int64)
	type sent struct {
		c      *call
		key    fencedKey
		offset int64
	}
	var calls []sent
	// refusedAtSend counts the commits sent to an engine that did not
	// own their group.
	refusedAtSend := 0
	for step := range steps {
		switch x := rng.IntN(100); {
		case x < 55: // a commit, mostly to the owner
			g := groups[rng.IntN(len(groups))]
			k := fencedKey{g, "t", int32(rng.IntN(2))}
			next[k]++
			e := owner[fs.partition(g)]
			if rng.IntN(4) == 0 {
				e = rng.IntN(len(eng))
			}
			c := eng[e].send(commitReq(8, g, "", -1, k.partition, next[k]))
			if !eng[e].w.owned[fs.partition(g)].Load() {
				// Owns is applied when the loop dispatches the
				// request, not when Handle is called (Kafka too
				// checks coordinatorship when it handles one): a
				// claim made before the loop got to it would serve
				// it under the new claim, after the old owner
				// acknowledged a later offset. The two commits are
				// concurrent, so either order is correct; wait for
				// the refusal so that "never backwards" holds.
				if code := commitCode(t, c.wait()); code != errNotCoordinator {
					t.Fatalf("step %d: commit at %s, which does not own %s: %s", step, eng[e].w.name, g, errName(code))
				}
				refusedAtSend++
				continue
			}
			calls = append(calls, sent{c, k, next[k]})
		case x < 65: // a heartbeat of the classic group
			e := rng.IntN(len(eng))
			want := errNotCoordinator
			if owner[cp] == e || zombie[cp] == e {
				want = errNone
			}
			if code := eng[e].heartbeat("c", ids[rng.IntN(len(ids))], gen); code != want {
				t.Fatalf("step %d: heartbeat at %s: %s, want %s (owner %d, zombie %d)", step, eng[e].w.name, errName(code), errName(want), owner[cp], zombie[cp])
			}
		case x < 75: // a graceful move
			p := uint32(rng.IntN(parts))
			from := owner[p]
			release(from, p)
			claim(1-from, p)
		case x < 82: // a move that fences a paused owner
			p := uint32(rng.IntN(parts))
			from := owner[p]
			claim(1-from, p)
			zombie[p] = from
		case x < 88: // paused owners notice and drop what they lost
			for p := range uint32(parts) {
				if z := zombie[p]; z >= 0 {
					release(z, p)
					zombie[p] = -1
				}
			}
		default: // hold or release an engine's offset writes
			e := rng.IntN(len(eng))
			if holds[e] == nil {
				holds[e] = make(chan struct{})
				eng[e].w.setHold(false, holds[e])
			} else {
				eng[e].w.setHold(false, nil)
				close(holds[e])
				holds[e] = nil
			}
		}
	}
	for e, h := range holds {
		if h != nil {
			eng[e].w.setHold(false, nil)
			close(h)
		}
	}
	final := map[fencedKey]int64{}
	acked, refused := 0, refusedAtSend
	for _, s := range calls {
		switch code := commitCode(t, s.c.wait()); code {
		case errNone:
			acked++
			final[s.key] = max(final[s.key], s.offset)
		case errNotCoordinator:
			refused++
		default:
			t.Fatalf("commit of %v at %d: %s", s.key, s.offset, errName(code))
		}
	}
	if bad := fs.wentBackwards(); len(bad) > 0 {
		t.Fatalf("committed offsets went backwards: %v", bad)
	}
	stored := fs.committed()
	for k, off := range final {
		if stored[k] < off {
			t.Fatalf("%v: commit of %d acknowledged, store holds %d", k, off, stored[k])
		}
	}
	if v, ok := storedRecord(t, fs.MemoryStore, "c"); !ok || v.Generation != gen || len(v.Members) != 2 {
		t.Fatalf("classic group record: %+v (generation %d expected, no rebalance)", v, gen)
	}
	for _, e := range eng {
		if snap, ok := e.e.Group("c"); ok && (snap.State != "Stable" || snap.Generation != gen) {
			t.Fatalf("%s holds c as %s at generation %d", e.w.name, snap.State, snap.Generation)
		}
	}
	if acked == 0 || refused == 0 || fs.fencedWrites() == 0 {
		t.Fatalf("the run exercised too little: %d acknowledged, %d refused, %d fenced writes", acked, refused, fs.fencedWrites())
	}
	t.Logf("%d commits acknowledged, %d refused (%d fenced at the store)", acked, refused, fs.fencedWrites())
}
