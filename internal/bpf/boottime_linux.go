package bpf

import "golang.org/x/sys/unix"

// bootNow is CLOCK_BOOTTIME in ns, the clock of the probes' bpf_ktime_get_boot_ns.
func bootNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}
