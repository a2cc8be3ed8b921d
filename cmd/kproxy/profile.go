package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// profileEnv names a file that kproxy writes a CPU profile of its whole
// run to (kbench's --kproxy-cpuprofile sets it). It is an environment
// variable rather than a flag: a profiling aid, not configuration.
const profileEnv = "KPROXY_CPUPROFILE"

// startProfile starts the CPU profile profileEnv asks for; the returned
// function stops it and closes the file.
func startProfile() (stop func(), err error) {
	path := os.Getenv(profileEnv)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
