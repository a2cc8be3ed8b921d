//go:build !unix

package proxy

// fdExhausted has no descriptor limit to recognise on this platform.
func fdExhausted(error) bool { return false }

// openFileLimit is unknown on this platform.
func openFileLimit() uint64 { return 0 }
