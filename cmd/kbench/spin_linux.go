package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

// The idle spinners of a --pin run (--pin-spin). On a virtual machine a
// CPU with nothing to run halts, and waking a halted vCPU goes through
// the hypervisor: measured here (KVM), it adds about a millisecond to the
// p99 of every request that crosses CPUs. The direct path of a pinned
// run never crosses (client and broker share CPU 0 and one process); the
// proxied path crosses twice each way. A spinner of policy SCHED_IDLE on
// each CPU keeps it from halting, as idle=poll would on bare metal, and
// takes no time from anything else (the scheduler runs a SCHED_IDLE
// thread only when nothing else wants the CPU, and preempts it on the
// next wake-up), so both paths pay the same and the ratio measures
// kproxy.

const spinWorkerArg = "__idle-spin"

// schedIdle is SCHED_IDLE of <linux/sched.h>.
const schedIdle = 5

// spinWorkerMain is the spinner process: it pins itself to the CPU of
// args[0], makes its thread SCHED_IDLE and spins until killed.
func spinWorkerMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "idle spinner: want a CPU")
		return 2
	}
	cpu, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "idle spinner:", err)
		return 2
	}
	runtime.LockOSThread()
	var param [1]int32 // struct sched_param: priority 0
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, 0, schedIdle, uintptr(unsafe.Pointer(&param))); errno != 0 {
		fmt.Fprintln(os.Stderr, "idle spinner: sched_setscheduler(SCHED_IDLE):", errno)
		return 1
	}
	if err := pinPID(os.Getpid(), cpu); err != nil {
		fmt.Fprintln(os.Stderr, "idle spinner:", err)
		return 1
	}
	os.Stdout.WriteString("spinning\n")
	//lint:ignore SA5002 spinning is this process's whole job (SCHED_IDLE: it yields to anything else).
	for {
	}
}

// startSpinners starts one spinner per CPU of cpus and returns a function
// that stops them. The kernel kills them if kbench dies first.
func startSpinners(cpus ...int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
	for _, cpu := range cpus {
		cmd, _, out, err := startWorker("idle spinner", []string{"GOMAXPROCS=1"}, spinWorkerArg, strconv.Itoa(cpu))
		if err != nil {
			stop()
			return nil, err
		}
		cmds = append(cmds, cmd)
		// The spinner says so once it is SCHED_IDLE and pinned; before
		// that it would compete with the benchmark at normal priority.
		var b [16]byte
		if n, err := out.Read(b[:]); err != nil || string(b[:n]) != "spinning\n" {
			stop()
			return nil, fmt.Errorf("idle spinner on CPU %d did not start (%q, %v)", cpu, b[:n], err)
		}
	}
	return stop, nil
}
