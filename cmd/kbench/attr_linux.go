package main

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the kernel kill the kproxy child if kbench dies
// first, so a crashed or interrupted run leaves nothing behind.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
