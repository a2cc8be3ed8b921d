package proxy

import (
	"bufio"
	"net"
	"sync"
)

// A session holds its socket buffers only while a frame is in flight
// (issue 13: an idle connection costs a few KiB, not four 64 KiB buffers):
//
//   - the client reader (br) and the upstream writer (upW), owned by the
//     reader goroutine, go back to their pools when the reader reaches a
//     request boundary with nothing buffered; the reader then waits for
//     the next request by reading into its stash, a few hundred bytes
//     inside the session, and takes a reader from the pool once bytes
//     arrive;
//   - the client writer (bw), the upstream reader (upR) and the rewrite
//     buffers (respBuf, outBuf), owned by the writer goroutine, go back
//     when the writer has no slot to answer; the writer waits for an
//     upstream response the same way, reading its first bytes into the
//     upstream stash before it takes a reader.
//
// Large frames still move by splice (pipe): the stash only ever holds
// the first bytes of a frame, which the pooled reader takes in its first
// fill, before any splice from the socket.

// stashSize is the bytes a waiting goroutine reads into its stash: a whole
// small frame (a Heartbeat, ApiVersions or Metadata request, a produce
// acknowledgement) fits, so that it is read with no more syscalls than a
// read into a full buffer.
const stashSize = 256

// stash reads from c, first returning what fill left in buf. The pooled
// bufio.Reader of a session reads through it. Owned by one goroutine
// (the client stash by the reader, the upstream stash by the writer).
type stash struct {
	c    net.Conn
	r, w int // buf[r:w] is unread
	buf  [stashSize]byte
}

// Read implements io.Reader: stashed bytes first (and only them, so that
// a frame's first bytes never wait on the socket), then the socket.
func (s *stash) Read(p []byte) (int, error) {
	if s.r < s.w {
		n := copy(p, s.buf[s.r:s.w])
		s.r += n
		return n, nil
	}
	return s.c.Read(p)
}

// fill blocks until c has bytes (or fails, or its deadline passes) and
// reads up to stashSize of them into the stash, which must be empty.
func (s *stash) fill() error {
	for {
		n, err := s.c.Read(s.buf[:])
		s.r, s.w = 0, n
		if n > 0 {
			return nil // an error with the bytes comes back on the next read
		}
		if err != nil {
			return err
		}
	}
}

// buffered returns the stashed bytes not yet read.
func (s *stash) buffered() int { return s.w - s.r }

// rewriteBufs are the writer's buffers for responses it encodes or
// rewrites, pooled between uses.
type rewriteBufs struct{ resp, out []byte }

var rewritePool = sync.Pool{New: func() any { return new(rewriteBufs) }}

// takeRewriteBufs gives the writer its rewrite buffers, from the pool.
// Called by the writer.
func (s *session) takeRewriteBufs() {
	if s.rw == nil {
		s.rw = rewritePool.Get().(*rewriteBufs)
		s.respBuf, s.outBuf = s.rw.resp[:0], s.rw.out[:0]
	}
}

// releaseWriteBufs returns the writer's buffers to their pools once it
// has nothing to answer: the client writer (which must have been
// flushed), the upstream reader unless it holds bytes, and the rewrite
// buffers. Called by the writer.
func (s *session) releaseWriteBufs() {
	if s.bw != nil && s.bw.Buffered() == 0 {
		putWriter(s.bw)
		s.bw = nil
	}
	if s.upR != nil && s.upR.Buffered() == 0 {
		putReader(s.upR)
		s.upR = nil
	}
	if s.rw != nil {
		s.rw.resp, s.rw.out = keep(s.respBuf), keep(s.outBuf)
		rewritePool.Put(s.rw)
		s.rw, s.respBuf, s.outBuf = nil, nil, nil
	}
}

// releaseReadBufs returns the reader's buffers to their pools at a
// request boundary: the client reader unless it holds bytes (pipelined
// requests), and the upstream writer once flushed. Called by the reader.
func (s *session) releaseReadBufs() {
	if s.br != nil && s.br.Buffered() == 0 {
		putReader(s.br)
		s.br = nil
	}
	if s.upW != nil && s.upW.Buffered() == 0 {
		putWriter(s.upW)
		s.upW = nil
	}
}

// clientBuffered returns the request bytes the reader holds: in its
// stash and in its pooled reader.
func (s *session) clientBuffered() int {
	n := s.in.buffered()
	if s.br != nil {
		n += s.br.Buffered()
	}
	return n
}

// upstreamReader returns the writer's upstream reader, waiting for the
// response's first bytes in the upstream stash before taking one from
// the pool. Called by the writer.
func (s *session) upstreamReader() (*bufio.Reader, error) {
	if s.upR != nil && s.upR.Buffered() == 0 && s.upIn.buffered() == 0 {
		// Waiting for a response (a fetch long poll) holds no buffer.
		putReader(s.upR)
		s.upR = nil
	}
	if s.upR == nil {
		if s.upIn.buffered() == 0 {
			if err := s.upIn.fill(); err != nil {
				return nil, err
			}
		}
		s.upR = getReader(&s.upIn)
	}
	return s.upR, nil
}
