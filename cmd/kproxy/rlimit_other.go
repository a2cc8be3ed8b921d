//go:build !unix

package main

import "log/slog"

// raiseFileLimit has nothing to raise on this platform.
func raiseFileLimit(*slog.Logger, int) {}
