package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// schedIdle puts every thread of this process under SCHED_IDLE. Threads the Go runtime
// starts later are cloned from these and inherit the policy. Where the model's own threads
// use every core, they then preempt the daemon's compression instead of sharing the cores
// with it; the ring absorbs the delay (docs/DEPLOY.md "CPU priority"). A thread that ends
// between the listing and the call is skipped.
func schedIdle() error {
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	// Again until a pass changes nothing: a thread cloned during a pass from one not yet
	// changed would keep the old policy.
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("--sched-idle: %w", err)
		}
		changed := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if cur, err := unix.SchedGetAttr(tid, 0); err == nil && cur.Policy == unix.SCHED_IDLE {
				continue
			}
			if err := unix.SchedSetAttr(tid, attr, 0); err != nil && err != unix.ESRCH {
				return fmt.Errorf("--sched-idle: sched_setattr(thread %d, SCHED_IDLE): %w", tid, err)
			}
			changed = true
		}
		if !changed {
			return nil
		}
	}
	return fmt.Errorf("--sched-idle: threads kept appearing with another policy")
}
