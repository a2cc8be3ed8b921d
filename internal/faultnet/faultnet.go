// Package faultnet is a TCP relay on loopback with faults that can be
// switched on and off while connections run, so that tests can make a
// network misbehave the way an operator's does: a partition that holds
// bytes without closing anything (a blackhole), added latency, a reset
// of every connection, and each of them in one direction only.
//
// A Relay listens on 127.0.0.1 and forwards every connection it accepts
// to its target; a test points a client (a kproxy's upstream, a fleet
// member's peer address, or a direct client's seed broker for the
// direct-equivalent fault) at the relay's address instead of the
// target's.
//
// A blackhole stops forwarding: the relay stops reading from the side
// that sends in the blackholed direction, holding at most the one chunk
// it had read, so that side's socket buffers fill and its writes block,
// as behind a partition in which TCP keeps retransmitting. Nothing is
// dropped and nothing is closed: on Heal the held bytes flow on, as they
// do when a partition heals before TCP gives up. New connections are
// accepted during a blackhole (a listener's backlog accepts them too)
// and are held the same way.
package faultnet

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Direction is which way bytes travel through a relay.
type Direction uint8

const (
	// ToTarget is from the client that connected to the relay to the
	// target: requests.
	ToTarget Direction = 1 << iota
	// ToClient is from the target back to the client: responses.
	ToClient
	// Both is both directions.
	Both = ToTarget | ToClient
)

// String returns the direction's name.
func (d Direction) String() string {
	switch d {
	case ToTarget:
		return "to_target"
	case ToClient:
		return "to_client"
	case Both:
		return "both"
	}
	return "none"
}

// Relay forwards TCP connections from its loopback address to a target,
// with switchable faults. Safe for concurrent use.
type Relay struct {
	ln     net.Listener // immutable
	target string       // immutable

	wg sync.WaitGroup // the accept loop and every pump goroutine

	mu        sync.Mutex
	blackhole Direction          // guarded by mu: directions not forwarded
	delay     [2]time.Duration   // guarded by mu: added latency, by direction index
	refuse    bool               // guarded by mu: new connections are closed at once
	changed   chan struct{}      // guarded by mu: closed and replaced on every change of faults
	conns     map[*pair]struct{} // guarded by mu: live connections
	closed    bool               // guarded by mu
	accepted  int                // guarded by mu: connections accepted so far
	bytes     [2]int64           // guarded by mu: bytes forwarded, by direction index
}

// pair is one relayed connection: the client's and the target's side.
type pair struct {
	client, target net.Conn      // immutable
	done           chan struct{} // closed by close
	once           sync.Once
}

func (p *pair) close(reset bool) {
	p.once.Do(func() {
		close(p.done)
		for _, c := range []net.Conn{p.client, p.target} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0) // close with RST, not FIN
			}
			c.Close()
		}
	})
}

// Listen starts a relay on 127.0.0.1 (an ephemeral port) to target.
func Listen(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listening: %w", err)
	}
	r := &Relay{ln: ln, target: target, changed: make(chan struct{}), conns: make(map[*pair]struct{})}
	r.wg.Add(1)
	go r.acceptLoop()
	return r, nil
}

// Addr is the relay's address, host:port, for the client to dial.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Target is where the relay forwards to.
func (r *Relay) Target() string { return r.target }

// Blackhole stops forwarding bytes in d (in addition to any direction
// already blackholed), keeping every connection open.
func (r *Relay) Blackhole(d Direction) {
	r.mu.Lock()
	r.blackhole |= d
	r.changedLocked()
	r.mu.Unlock()
}

// Delay adds latency to every chunk of bytes forwarded in d from now on;
// 0 removes it. Order is kept.
func (r *Relay) Delay(d Direction, latency time.Duration) {
	r.mu.Lock()
	for i, dir := range []Direction{ToTarget, ToClient} {
		if d&dir != 0 {
			r.delay[i] = latency
		}
	}
	r.changedLocked()
	r.mu.Unlock()
}

// Refuse makes the relay close every connection it accepts from now on
// at once (on: true), as a port nobody listens on would refuse it.
func (r *Relay) Refuse(on bool) {
	r.mu.Lock()
	r.refuse = on
	r.mu.Unlock()
}

// Reset closes every live connection with a TCP reset on both sides.
// New connections are relayed as before.
func (r *Relay) Reset() {
	r.mu.Lock()
	ps := make([]*pair, 0, len(r.conns))
	for p := range r.conns {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	for _, p := range ps {
		p.close(true)
	}
}

// Heal removes every fault: blackholes, delays and refusal. Held bytes
// flow on.
func (r *Relay) Heal() {
	r.mu.Lock()
	r.blackhole, r.delay, r.refuse = 0, [2]time.Duration{}, false
	r.changedLocked()
	r.mu.Unlock()
}

// Stats is what a relay has done so far.
type Stats struct {
	Accepted int   // connections accepted
	Live     int   // connections open now
	ToTarget int64 // bytes forwarded to the target
	ToClient int64 // bytes forwarded to clients
}

// Stats reports the relay's counters.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Accepted: r.accepted, Live: len(r.conns), ToTarget: r.bytes[0], ToClient: r.bytes[1]}
}

// Close stops the relay: the listener and every connection close, and
// Close returns once every goroutine of the relay has ended.
func (r *Relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closed = true
	r.changedLocked()
	ps := make([]*pair, 0, len(r.conns))
	for p := range r.conns {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	err := r.ln.Close()
	for _, p := range ps {
		p.close(false)
	}
	r.wg.Wait()
	return err
}

func (r *Relay) changedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Relay) acceptLoop() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		r.accepted++
		refuse, closed := r.refuse, r.closed
		r.mu.Unlock()
		if refuse || closed {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		t, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p := &pair{client: c, target: t, done: make(chan struct{})}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			p.close(false)
			return
		}
		r.conns[p] = struct{}{}
		r.wg.Add(2)
		r.mu.Unlock()
		go r.pump(p, c, t, 0)
		go r.pump(p, t, c, 1)
	}
}

// gate returns the delay of direction i, waiting while i is blackholed;
// ok=false once the relay or p closed.
func (r *Relay) gate(p *pair, i int) (time.Duration, bool) {
	dir := [2]Direction{ToTarget, ToClient}[i]
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return 0, false
		}
		if r.blackhole&dir == 0 {
			d := r.delay[i]
			r.mu.Unlock()
			return d, true
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-p.done:
			return 0, false
		}
	}
}

// chunk is bytes read from one side, waiting to be written to the other.
type chunk struct {
	b    []byte
	read time.Time
}

// pump relays src to dst in direction index i with two goroutines: a
// reader that waits out a blackhole before each read (so a blackholed
// sender's buffers fill) and a writer that waits out a blackhole and
// the delay before each write, so that latency adds to every chunk
// without limiting throughput, and order is kept. Either side ending
// closes the pair (Kafka's protocol has no half close).
func (r *Relay) pump(p *pair, src, dst net.Conn, i int) {
	defer r.wg.Done()
	defer r.forget(p)
	q := make(chan chunk, 64)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(q)
		for {
			if _, ok := r.gate(p, i); !ok {
				return
			}
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		p.close(false)
		for range q { // let the reader end
		}
	}()
	for c := range q {
		d, ok := r.gate(p, i)
		if !ok {
			return
		}
		if wait := time.Until(c.read.Add(d)); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
		r.mu.Lock()
		r.bytes[i] += int64(len(c.b))
		r.mu.Unlock()
	}
}

// forget closes p and drops it from the live connections.
func (r *Relay) forget(p *pair) {
	p.close(false)
	r.mu.Lock()
	delete(r.conns, p)
	r.mu.Unlock()
}
