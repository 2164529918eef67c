package codec

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time: benchmarks that lock their goroutine to its
// thread report bytes per CPU-second with it, which another process's load on a shared
// machine does not lower (the wall clock's ns/op it does).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return time.Duration(time.Now().UnixNano())
	}
	return time.Duration(ts.Nano())
}
