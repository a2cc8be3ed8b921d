package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
)

// startWorker starts kbench itself as a worker process (main dispatches
// on args[0]: the idle-connections worker, the relay, the idle
// spinner), with env added to kbench's environment, its stderr shared,
// and pipes to its stdin and from its stdout. The kernel kills it if
// kbench dies first.
func startWorker(name string, env []string, args ...string) (cmd *exec.Cmd, in io.WriteCloser, out io.ReadCloser, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	cmd = exec.Command(self, args...)
	setChildAttrs(cmd)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = os.Stderr
	if in, err = cmd.StdinPipe(); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if out, err = cmd.StdoutPipe(); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return cmd, in, out, nil
}
