package proxy

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

// Responses that carry records or many partitions and broker endpoints
// (ShareFetch, ShareAcknowledge, Produce v10+: codec.Streamable) are
// rewritten as they stream (codec.StreamEndpoints), not decoded whole.
// Their endpoints come last while the frame's size, which the rewrite
// changes, goes first, so the bytes before the endpoints wait in a spool
// until the endpoints are read: the first spoolMem bytes in memory, the
// rest in an unlinked temporary file (os.TempDir, so TMPDIR), which the
// kernel's page cache holds and sendfile sends. A connection's memory for
// such a response is spoolMem plus its socket buffers, whatever the
// response's size; max_rewrite_response_bytes bounds only the small end
// after the partitions. If no temporary file can be created, the spool
// stays in memory within max_rewrite_response_bytes and the process
// budget (frame_memory_bytes), as for a response decoded whole, and one
// warning says so.

// spoolMem is the bytes of a streamed response a spool keeps in memory.
const spoolMem = bufSize

// spool holds the bytes of one streamed response that precede its
// rewritten end. A session's writer owns one, reused for each such
// response (a field, so that none is allocated).
type spool struct {
	p        *Proxy
	total    int      // the upstream frame's size, prefix included: the in-memory fallback's reservation
	mem      []byte   // the first bytes; in memory past spoolMem only in the fallback
	f        *os.File // the rest, once mem is full; nil until then
	n        int64    // bytes in f
	reserved bool     // the fallback reserved total from the budget
	prefix   [4]byte  // the rewritten frame's size, as sent
}

// Write implements io.Writer for codec.StreamEndpoints.
func (sp *spool) Write(b []byte) (int, error) {
	if sp.f == nil {
		limit := spoolMem
		if sp.reserved {
			limit = sp.total
		}
		if len(sp.mem)+len(b) <= limit {
			sp.mem = append(sp.mem, b...)
			return len(b), nil
		}
		if err := sp.spill(); err != nil {
			return 0, err
		}
		if sp.f == nil { // the fallback: in memory
			sp.mem = append(sp.mem, b...)
			return len(b), nil
		}
	}
	n, err := sp.f.Write(b)
	sp.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("spilling a streamed response: %w", err)
	}
	return n, nil
}

// spill opens the spool's file, or falls back to memory.
func (sp *spool) spill() error {
	f, err := os.CreateTemp("", "kproxy-spool-*")
	if err == nil {
		// Unlinked at once: the file goes when it is closed, or when
		// the process dies.
		if err = os.Remove(f.Name()); err == nil {
			sp.f = f
			return nil
		}
		f.Close()
	}
	if sp.p.spillWarned.CompareAndSwap(false, true) {
		sp.p.log.Warn("cannot spill streamed responses to a temporary file; holding them in memory within max_rewrite_response_bytes", "err", err)
	}
	if limit := sp.p.cfg.MaxRewriteResponse; sp.total-4 > int(limit) {
		sp.p.metrics.refused(refusedTooLarge)
		return fmt.Errorf("cannot spill a %d byte response (%w) and it is over the %d byte limit for responses held in memory (max_rewrite_response_bytes)", sp.total-4, err, limit)
	}
	if err := sp.p.reserveFrame(sp.total); err != nil {
		return err
	}
	sp.reserved = true
	return nil
}

// len is the bytes held.
func (sp *spool) len() int { return len(sp.mem) + int(sp.n) }

// writeTo writes the held bytes to w; from the file by sendfile when w's
// connection is a TCP socket.
func (sp *spool) writeTo(w *bufio.Writer) error {
	if _, err := w.Write(sp.mem); err != nil {
		return err
	}
	if sp.f == nil {
		return nil
	}
	if _, err := sp.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reading back a spilled response: %w", err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	n, err := w.ReadFrom(io.LimitReader(sp.f, sp.n))
	if err == nil && n != sp.n {
		err = fmt.Errorf("reading back a spilled response: %d of %d bytes", n, sp.n)
	}
	return err
}

// close drops the file and the fallback's reservation.
func (sp *spool) close() {
	if sp.f != nil {
		sp.f.Close()
		sp.f, sp.n = nil, 0
	}
	if sp.reserved {
		sp.p.budget.release(int64(sp.total))
		sp.reserved = false
	}
}
