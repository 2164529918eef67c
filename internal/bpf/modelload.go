package bpf

import (
	"fmt"
	"time"

	"github.com/strap-llm/strap/internal/trace"
)

// userHZ is the unit of /proc/<pid>/stat's starttime (USER_HZ: 100 on every Linux ABI).
const userHZ = 100

// TakeModelLoad ends pid's model-load phase now: when the probes saw pid open a weight
// file since its last phase was taken, it returns the phase (ok) and forgets the open, so
// a model loaded later is measured afresh. ok is false when the probes saw no such open,
// or saw one of an earlier process that had the same pid. Without the kernel probes it
// returns ErrUnsupported.
func (c *Collector) TakeModelLoad(session string, pid int) (trace.ModelLoad, bool, error) {
	if pid <= 0 {
		return trace.ModelLoad{}, false, ErrBadPID
	}
	bootNs, err := bootNow()
	if err != nil {
		return trace.ModelLoad{}, false, fmt.Errorf("boot-time clock: %w", err)
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return trace.ModelLoad{}, false, ErrClosed
	}
	if c.probes == nil || c.status[trace.CollectorSyscalls].Source != trace.SourceBPF {
		return trace.ModelLoad{}, false, ErrUnsupported
	}
	w, ok, err := c.probes.takeWeightOpen(uint32(pid))
	if err != nil || !ok {
		return trace.ModelLoad{}, false, err
	}
	if w.StartBoot != 0 {
		// A pid reused since the open: the recorded start is not this process's.
		p, err := c.procFS.Proc(pid)
		if err != nil {
			return trace.ModelLoad{}, false, fmt.Errorf("proc %d: %w", pid, err)
		}
		st, err := p.Stat()
		if err != nil {
			return trace.ModelLoad{}, false, fmt.Errorf("proc %d stat: %w", pid, err)
		}
		if d := int64(w.StartBoot/(1e9/userHZ)) - int64(st.Starttime); d < -1 || d > 1 {
			return trace.ModelLoad{}, false, nil
		}
	}
	return newModelLoad(session, pid, w, now, bootNs), true, nil
}

// weightOpen is a process's first weight-file open as the probes recorded it.
type weightOpen struct {
	Path string
	// BootNs is CLOCK_BOOTTIME at the open; StartBoot the process's start on the same
	// clock (0 when the kernel does not say).
	BootNs, StartBoot uint64
}

// newModelLoad is the phase from w to now (bootNow on the boot-time clock).
func newModelLoad(session string, pid int, w weightOpen, now time.Time, bootNow uint64) trace.ModelLoad {
	var d time.Duration
	if bootNow > w.BootNs {
		d = time.Duration(bootNow - w.BootNs)
	}
	end := float64(now.UnixMicro()) / 1e6
	return trace.ModelLoad{Session: session, PID: pid, Path: w.Path, Start: end - d.Seconds(), End: end, DurationS: d.Seconds()}
}
