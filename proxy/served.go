package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// localMovedCheck is how often a request waiting for the store checks
// whether its group is still served here.
const localMovedCheck = 250 * time.Millisecond

// whileServed runs a request whose answer may wait for a store write
// (storeBound) and may so outlive this kproxy's ownership of its group: a
// lost fleet lease leaves the store call hanging on an unreachable
// cluster up to the store timeout, and its answer would hold up every
// later answer on the client's connection, its heartbeats' included.
//
// handle starts the request and calls its argument with the answer,
// which whileServed passes to answer. Every localMovedCheck until then,
// served says whether the group is still served here; once it is not,
// moved is called instead (the write lands before the new owner's claim
// or not at all, and the client retries it there) and the answer, when
// it comes, is dropped. Exactly one of answer and moved is called.
func whileServed(served func() bool, handle func(reply func(kmsg.Response)), answer func(kmsg.Response), moved func()) {
	var answered atomic.Bool
	var mu sync.Mutex // guards timer between the answer and the watch
	var timer *time.Timer
	var watch func()
	watch = func() {
		if answered.Load() {
			return
		}
		if served() {
			mu.Lock()
			if !answered.Load() {
				timer = time.AfterFunc(localMovedCheck, watch)
			}
			mu.Unlock()
			return
		}
		if answered.CompareAndSwap(false, true) {
			moved()
		}
	}
	mu.Lock()
	timer = time.AfterFunc(localMovedCheck, watch)
	mu.Unlock()
	handle(func(resp kmsg.Response) {
		if !answered.CompareAndSwap(false, true) {
			return // moved was called
		}
		mu.Lock()
		timer.Stop()
		mu.Unlock()
		answer(resp)
	})
}
