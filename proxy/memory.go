package proxy

import (
	"fmt"
	"io"
	"sync/atomic"
)

// Frames kproxy must hold whole: a request it serves itself (group APIs,
// FindCoordinator) is decoded from memory, and a response that carries
// broker addresses is decoded, rewritten and encoded again, except those
// whose addresses follow their records or partitions, which are
// rewritten as they stream (spool.go). Every other frame streams through
// the session's pooled socket buffers (buffers.go).
// Held frames are bounded three ways:
//
//   - per API: a group request larger than Config.MaxGroupRequest, or a
//     response to rewrite larger than Config.MaxRewriteResponse, closes
//     the connection as soon as its size prefix is read;
//   - process-wide: a frame reserves its announced size from the budget
//     (Config.FrameMemory) before any of its body is read, and a frame
//     that does not fit is refused, its connection closed with one log
//     line; the reservation is released once the frame is decoded (a
//     request) or written to the client (a response);
//   - as it arrives: the buffer grows with the bytes actually received,
//     so a frame that announces 8 MiB and stalls after 64 KiB holds
//     about 64 KiB, and the read timeout (Config.RequestTimeout) ends it.
//
// Rewrite buffers go back to a pool once the session's writer has nothing
// to answer; those larger than retainMax are dropped instead, so the
// memory of a burst goes back to the runtime.

// retainMax is the largest frame buffer kept for reuse.
const retainMax = 1 << 20

// budget is the process-wide count of bytes reserved by held frames.
// Safe for concurrent use.
type budget struct {
	limit int64
	used  atomic.Int64
}

// reserve takes n bytes from the budget, or reports that they do not fit.
func (b *budget) reserve(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *budget) release(n int64) { b.used.Add(-n) }

// errBudget reports a frame refused because the budget is spent.
type errBudget struct{ want, used, limit int64 }

func (e *errBudget) Error() string {
	return fmt.Sprintf("frame memory budget exhausted: a %d byte frame does not fit (%d of %d bytes held; frame_memory_bytes)", e.want, e.used, e.limit)
}

func (p *Proxy) reserveFrame(n int) error {
	if p.budget.reserve(int64(n)) {
		return nil
	}
	p.metrics.refused(refusedBudget)
	return &errBudget{int64(n), p.budget.used.Load(), p.budget.limit}
}

// readGrowing reads exactly total bytes from r into buf (reusing it when
// its capacity is enough), growing the buffer only as bytes arrive.
func readGrowing(r io.Reader, buf []byte, total int) ([]byte, error) {
	if cap(buf) >= total {
		b := buf[:total]
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, 0, min(total, max(cap(buf), bufSize)))
	for len(b) < total {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(total, 2*cap(b)))
			copy(nb, b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil && len(b) < total {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}

// keep returns b for the session to reuse, or nil when it is too big to
// hold on to.
func keep(b []byte) []byte {
	if cap(b) > retainMax {
		return nil
	}
	return b
}
