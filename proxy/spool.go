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
// until the endpoints are read: the first spoolSmall bytes in memory (a
// produce acknowledgement, a small ShareFetch), up to spoolMem in memory
// if the process budget (frame_memory_bytes) grants it, and the rest in
// an unlinked temporary file (os.TempDir, so TMPDIR), which the kernel's
// page cache holds and sendfile sends. A connection's memory for such a
// response is thus at most spoolMem plus its socket buffers, whatever the
// response's size; max_rewrite_response_bytes bounds only the small end
// after the partitions. If no temporary file can be created, the spool
// stays in memory within max_rewrite_response_bytes and the budget, as
// for a response decoded whole, and one warning says so.
//
// Measured on 2 shared cores (BenchmarkStreamedResponse): a 256 KiB
// ShareFetch held in memory went through at 1.3-1.6 GB/s, spilled past
// 64 KiB at 0.8-0.9 GB/s; at 4 MiB spilling costs about what reading the
// response whole did. Hence spoolMem.

const (
	// spoolSmall is what a spool holds in memory without asking the budget.
	spoolSmall = bufSize
	// spoolMem is the most a spool holds in memory; it is also the
	// largest rewrite buffer the pool keeps (retainMax).
	spoolMem = retainMax
)

// spool holds the bytes of one streamed response that precede its
// rewritten end. A session's writer owns one, reused for each such
// response (a field, so that none is allocated).
type spool struct {
	p        *Proxy
	total    int      // the upstream frame's size, prefix included
	mem      []byte   // the first bytes
	f        *os.File // the rest, once mem is full; nil until then
	n        int64    // bytes in f
	asked    bool     // the budget was asked for room past spoolSmall
	granted  int      // bytes past spoolSmall the budget granted
	reserved bool     // the fallback (no file) reserved total from the budget
	prefix   [4]byte  // the rewritten frame's size, as sent
}

// limit is the bytes mem may hold.
func (sp *spool) limit() int {
	if sp.reserved {
		return sp.total
	}
	return spoolSmall + sp.granted
}

// Write implements io.Writer for codec.StreamEndpoints.
func (sp *spool) Write(b []byte) (int, error) {
	if sp.f == nil {
		if len(sp.mem)+len(b) > sp.limit() && !sp.asked {
			sp.grow()
		}
		if len(sp.mem)+len(b) <= sp.limit() {
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

// grow asks the budget for room to hold up to spoolMem in memory, and
// sizes mem for it at once (a buffer grown by append would outgrow
// retainMax and not be kept).
func (sp *spool) grow() {
	sp.asked = true
	want := min(sp.total, spoolMem) - spoolSmall
	if want <= 0 || !sp.p.budget.reserve(int64(want)) {
		return
	}
	sp.granted = want
	if cap(sp.mem) < spoolSmall+want {
		m := make([]byte, len(sp.mem), spoolSmall+want)
		copy(m, sp.mem)
		sp.mem = m
	}
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

// close drops the file and the spool's reservations.
func (sp *spool) close() {
	if sp.granted > 0 {
		sp.p.budget.release(int64(sp.granted))
	}
	sp.asked, sp.granted = false, 0
	if sp.f != nil {
		sp.f.Close()
		sp.f, sp.n = nil, 0
	}
	if sp.reserved {
		sp.p.budget.release(int64(sp.total))
		sp.reserved = false
	}
}
