package proxy

import (
	"time"
)

// acceptLogEvery is the most often a failing accept is logged: a
// listener out of file descriptors fails every retry, and one line says
// enough.
const acceptLogEvery = 10 * time.Second

// acceptFailed counts a failed accept on node's listener and logs it, at
// most one line every acceptLogEvery; retry is the backoff before the
// next accept. A failure for lack of file descriptors (EMFILE, ENFILE)
// says so and names the limit: the connection stays in the listen
// backlog until descriptors free up.
func (p *Proxy) acceptFailed(node int32, err error, retry time.Duration) {
	fds := fdExhausted(err)
	p.metrics.acceptError(fds)
	n := p.acceptFails.Add(1)
	now := nanotime()
	last := p.lastAcceptLog.Load()
	if (last != 0 && now-last < int64(acceptLogEvery)) || !p.lastAcceptLog.CompareAndSwap(last, now) {
		return
	}
	p.acceptFails.Add(-n)
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	if fds {
		p.log.Error("accept failed: out of file descriptors; new connections wait in the listen backlog until some close (each client connection takes two: raise the open-file limit, ulimit -n or systemd LimitNOFILE, or lower max_connections)",
			"node", node, "err", err, "open_client_connections", open, "open_file_limit", openFileLimit(),
			"failed_since_last_line", n, "retry_in", retry)
		return
	}
	p.log.Warn("accept failed", "node", node, "err", err, "open_client_connections", open, "failed_since_last_line", n, "retry_in", retry)
}
