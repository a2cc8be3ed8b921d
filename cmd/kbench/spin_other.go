//go:build !linux

package main

import (
	"errors"
	"os"
)

const spinWorkerArg = "__idle-spin"

func spinWorkerMain([]string) int {
	os.Stderr.WriteString("idle spinner: Linux only\n")
	return 2
}

// startSpinners is Linux only (SCHED_IDLE), as --pin is.
func startSpinners(...int) (func(), error) { return nil, errors.New("--pin-spin needs Linux") }
