//go:build unix

package main

import (
	"log/slog"
	"syscall"
)

// raiseFileLimit raises the soft limit on open files to the hard limit
// (each client connection takes two descriptors: its own and its
// upstream's) and logs the limits, so that running out of them is never
// a surprise. Go's runtime does the same at start on most platforms;
// this makes it explicit and visible.
func raiseFileLimit(log *slog.Logger) {
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
	log.Info("open-file limit", "soft", lim.Cur, "hard", lim.Max, "client_connections_at_most", lim.Cur/2)
}
