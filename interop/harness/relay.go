package main

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// faultRelay is the fault rows' TCP relay (faults.go): it listens on
// loopback and forwards every connection to its target, and can hold
// every byte (a blackhole: nothing is closed or dropped, the senders'
// socket buffers fill as behind a partition in which TCP keeps
// retransmitting, and on heal the held bytes flow on) or add latency to
// every chunk. The delay applies to both directions; the hole to both
// (set) or to one of them (setHoles): a one-way partition, in which one
// side's bytes keep arriving while nothing comes back, or the reverse.
//
// The harness is a module of its own and cannot import kproxy's
// internal/faultnet, which the e2e tests use; this is the same idea cut
// down to what the rows need, so that the interop tier tests kproxy's
// binary without a test hook inside it (kproxy's hidden
// --upstream-dial-via only points its dials at the relay).
type faultRelay struct {
	ln     net.Listener // immutable
	target string       // immutable
	wg     sync.WaitGroup

	mu      sync.Mutex
	holes   direction     // guarded by mu: the directions whose bytes are held
	delay   time.Duration // guarded by mu: added to every chunk
	changed chan struct{} // guarded by mu: closed and replaced on every change
	conns   []net.Conn    // guarded by mu: both sides of every relayed connection
	closed  bool          // guarded by mu
}

// direction is a set of a relayed connection's directions.
type direction uint8

const (
	// toTarget is the connecting side's bytes to the target (a
	// client's requests to its broker).
	toTarget direction = 1 << iota
	// toClient is the target's bytes back (the broker's responses).
	toClient
	// bothWays is a full blackhole.
	bothWays = toTarget | toClient
)

func (d direction) String() string {
	switch d {
	case 0:
		return "none"
	case toTarget:
		return "client->target"
	case toClient:
		return "target->client"
	case bothWays:
		return "both ways"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// listenRelay starts a relay on an ephemeral loopback port to target.
func listenRelay(target string) (*faultRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault relay: %w", err)
	}
	r := &faultRelay{ln: ln, target: target, changed: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *faultRelay) addr() string { return r.ln.Addr().String() }

// set switches the faults: hole holds every byte both ways, delay is
// added to each.
func (r *faultRelay) set(hole bool, delay time.Duration) {
	holes := direction(0)
	if hole {
		holes = bothWays
	}
	r.setHoles(holes, delay)
}

// setHoles switches the faults: the bytes of the directions in holes are
// held (the others flow), delay is added to each chunk that flows.
func (r *faultRelay) setHoles(holes direction, delay time.Duration) {
	r.mu.Lock()
	r.holes, r.delay = holes, delay
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *faultRelay) heal() { r.setHoles(0, 0) }

// state returns the faults of direction dir now and a channel closed at
// their next change.
func (r *faultRelay) state(dir direction) (hole bool, delay time.Duration, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holes&dir != 0, r.delay, r.changed
}

func (r *faultRelay) close() {
	r.heal() // a held pump must see its connections close
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	r.wg.Wait()
}

func (r *faultRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			t.Close()
			return
		}
		r.conns = append(r.conns, c, t)
		r.wg.Add(2)
		r.mu.Unlock()
		go r.pump(c, t, toTarget)
		go r.pump(t, c, toClient)
	}
}

// relayQueue is how many chunks of one direction may wait out the delay
// at once.
const relayQueue = 64

// chunk is bytes read at a moment.
type chunk struct {
	b  []byte
	at time.Time
}

// pump copies src to dst, direction dir, chunk by chunk, each held while
// dir is a hole and sent no earlier than its arrival plus the delay, in
// the order read (a held chunk holds every chunk behind it, as a TCP
// stream does). Chunks are read as they arrive, up to relayQueue waiting
// out their delay, so that requests pipelined on one connection each get
// the delay once (a reader that waited for the pump stamped a third
// chunk with the time the first left, up to one more delay late); while
// dir is a hole the reader stops, so a held direction's sender feels TCP
// backpressure.
//
// When src ends (a close, or an error), the chunks already read are
// written and, once dir is no hole, both connections are closed: a
// one-way hole toClient still carries the client's close to the target,
// as a one-way partition carries its FIN, and a hole toTarget holds it.
func (r *faultRelay) pump(src, dst net.Conn, dir direction) {
	defer r.wg.Done()
	chunks := make(chan chunk, relayQueue)
	go func() {
		defer close(chunks)
		for {
			// A held direction stops reading, so that its sender
			// feels TCP backpressure.
			for {
				hole, _, changed := r.state(dir)
				if !hole {
					break
				}
				<-changed
			}
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		src.Close()
		dst.Close()
		for range chunks { // let the reader end
		}
	}()
	for c := range chunks {
		for {
			hole, delay, changed := r.state(dir)
			if hole {
				<-changed
				continue
			}
			if wait := time.Until(c.at.Add(delay)); wait > 0 {
				select {
				case <-time.After(wait):
				case <-changed:
					continue // the delay may have changed
				}
			}
			break
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
	// src ended: its close is held like its bytes (a reader already in
	// Read when the hole went on reads the close too).
	for {
		hole, _, changed := r.state(dir)
		if !hole {
			return
		}
		<-changed
	}
}
