package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// pinPID sets the CPU affinity of every thread of pid to cpu alone.
// Threads the process starts later inherit the mask from the thread that
// starts them, so a process pinned once stays pinned; calling it again
// catches a thread started while the first call walked the list.
func pinPID(pid, cpu int) error {
	if cpu < 0 || cpu >= 1024 {
		return fmt.Errorf("pin: CPU %d out of range", cpu)
	}
	var mask [16]uint64 // cpu_set_t of 1024 CPUs
	mask[cpu/64] = 1 << (cpu % 64)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("pin: listing the threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
		if errno != 0 && errno != syscall.ESRCH { // ESRCH: the thread ended meanwhile
			return fmt.Errorf("pin: sched_setaffinity(%d, CPU %d): %w", tid, cpu, errno)
		}
	}
	return nil
}
