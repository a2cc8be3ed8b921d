//go:build !linux

package main

import "errors"

// pinPID is Linux only (sched_setaffinity).
func pinPID(pid, cpu int) error { return errors.New("--pin needs Linux") }
