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
// every chunk. Both apply to both directions.
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
	hole    bool          // guarded by mu: bytes are held
	delay   time.Duration // guarded by mu: added to every chunk
	changed chan struct{} // guarded by mu: closed and replaced on every change
	conns   []net.Conn    // guarded by mu: both sides of every relayed connection
	closed  bool          // guarded by mu
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

// set switches the faults: hole holds every byte, delay is added to each.
func (r *faultRelay) set(hole bool, delay time.Duration) {
	r.mu.Lock()
	r.hole, r.delay = hole, delay
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *faultRelay) heal() { r.set(false, 0) }

// state returns the faults now and a channel closed at their next change.
func (r *faultRelay) state() (hole bool, delay time.Duration, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hole, r.delay, r.changed
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
		go r.pump(c, t)
		go r.pump(t, c)
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

// pump copies src to dst chunk by chunk, each held while the relay is a
// blackhole and sent no earlier than its arrival plus the delay. Chunks
// are read as they arrive, up to relayQueue waiting out their delay, so
// that requests pipelined on one connection each get the delay once (a
// reader that waited for the pump stamped a third chunk with the time
// the first left, up to one more delay late); while the relay is a
// blackhole the reader stops, so a held direction's sender feels TCP
// backpressure.
func (r *faultRelay) pump(src, dst net.Conn) {
	defer r.wg.Done()
	chunks := make(chan chunk, relayQueue)
	go func() {
		defer close(chunks)
		for {
			// A held direction stops reading, so that its sender
			// feels TCP backpressure.
			for {
				hole, _, changed := r.state()
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
			hole, delay, changed := r.state()
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
}
