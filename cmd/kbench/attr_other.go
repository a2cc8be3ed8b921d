//go:build !linux

package main

import "os/exec"

// setChildAttrs does nothing here: only Linux can tie the child's life to
// kbench's (and only Linux has the /proc files kbench reads).
func setChildAttrs(cmd *exec.Cmd) {}
