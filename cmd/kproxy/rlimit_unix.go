//go:build unix

package main

import (
	"log/slog"
	"syscall"
)

// fdsPerConn is the descriptors one client connection takes: its own
// and its upstream's.
const fdsPerConn = 2

// fdHeadroom is the descriptors kept for listeners, the discovery
// client, the fleet and log files.
const fdHeadroom = 64

// raiseFileLimit raises the soft limit on open files to the hard limit
// and logs the limits it got, so that running out of them is never a
// surprise: at Info when they allow maxConns client connections (0: the
// proxy's default, 50,000), at Warn, saying what to raise, when they do
// not. Go's runtime raises the soft limit at start on most platforms;
// this makes it explicit and visible.
func raiseFileLimit(log *slog.Logger, maxConns int) {
	if maxConns <= 0 {
		maxConns = 50000
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open-file limit", "err", err)
		return
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("cannot raise the open-file limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
		} else {
			lim = raised
		}
	}
	conns := uint64(0)
	if lim.Cur > fdHeadroom {
		conns = (uint64(lim.Cur) - fdHeadroom) / fdsPerConn
	}
	if conns < uint64(maxConns) {
		log.Warn("open-file limit allows fewer client connections than max_connections: beyond it accepts fail (EMFILE) and wait; raise the hard limit (ulimit -Hn, systemd LimitNOFILE) or lower max_connections",
			"soft", lim.Cur, "hard", lim.Max, "client_connections_at_most", conns, "max_connections", maxConns)
		return
	}
	log.Info("open-file limit", "soft", lim.Cur, "hard", lim.Max, "client_connections_at_most", conns, "max_connections", maxConns)
}
