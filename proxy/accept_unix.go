//go:build unix

package proxy

import (
	"errors"
	"syscall"
)

// fdExhausted says whether err is a lack of file descriptors, of the
// process (EMFILE) or of the system (ENFILE).
func fdExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// openFileLimit returns the process's soft limit on open files, 0 when
// it cannot be read.
func openFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return uint64(lim.Cur)
}
