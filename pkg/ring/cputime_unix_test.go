//go:build unix

package ring_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the test process has used so far, user and
// system, all threads (the garbage collector's included).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
