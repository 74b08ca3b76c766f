package grammar

import (
	"syscall"
	"time"
)

// threadCPU is the calling thread's CPU time (the bench locks its OS thread): on a loaded
// machine wall time includes time spent descheduled.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
