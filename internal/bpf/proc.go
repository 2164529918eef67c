package bpf

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/blockdevice"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

// ProcFaults are the cumulative fault counters of /proc/<pid>/stat.
type ProcFaults struct {
	// Minor is minflt (field 10), Major is majflt (field 12).
	Minor, Major uint64
}

// readProcFaults reads pid's fault counters with procfs, which counts the fields after
// the last ')' (a command name may hold spaces and parentheses).
func readProcFaults(fs procfs.FS, pid int) (ProcFaults, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return ProcFaults{}, err
	}
	st, err := p.Stat()
	if err != nil {
		return ProcFaults{}, fmt.Errorf("proc stat %d: %w", pid, err)
	}
	return ProcFaults{Minor: uint64(st.MinFlt), Major: uint64(st.MajFlt)}, nil
}

// readMemory reads pid's resident set size and its peak from /proc/<pid>/status.
func readMemory(fs procfs.FS, pid int) (trace.Memory, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return trace.Memory{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return trace.Memory{}, fmt.Errorf("proc status %d: %w", pid, err)
	}
	return trace.Memory{RSSBytes: st.VmRSS, RSSPeakBytes: st.VmHWM}, nil
}

// ctxSwitches sums voluntary/nonvoluntary_ctxt_switches over every thread of pid; the
// process-level status file only shows the leader thread's.
func ctxSwitches(fs procfs.FS, pid int) (vol, invol uint64, err error) {
	threads, err := fs.AllThreads(pid)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range threads {
		st, err := t.NewStatus()
		if err != nil {
			continue // thread exited between readdir and read
		}
		vol += st.VoluntaryCtxtSwitches
		invol += st.NonVoluntaryCtxtSwitches
	}
	return vol, invol, nil
}

// diskStat is one line of /proc/diskstats: the block I/O fallback.
type diskStat struct {
	name                  string
	reads, writes         uint64
	readBytes, writeBytes uint64
	inflight              int64
}

// diskstats reads /proc/diskstats with procfs, keyed like the tracepoints' device
// numbers (major<<20 | minor); sectors are 512 bytes regardless of the device.
func diskstats(fs blockdevice.FS) (map[uint32]diskStat, error) {
	all, err := fs.ProcDiskstats()
	if err != nil {
		return nil, fmt.Errorf("diskstats: %w", err)
	}
	out := make(map[uint32]diskStat, len(all))
	for _, d := range all {
		out[d.MajorNumber<<20|d.MinorNumber] = diskStat{
			name: d.DeviceName, reads: d.ReadIOs, readBytes: d.ReadSectors * 512,
			writes: d.WriteIOs, writeBytes: d.WriteSectors * 512, inflight: int64(d.IOsInProgress),
		}
	}
	return out, nil
}

// devNames maps the tracepoint device number (major<<20 | minor) to the kernel's name
// through /sys/dev/block/M:m/uevent, caching the answers.
type devNames struct {
	sysRoot string
	cache   map[uint32]string
}

func (d *devNames) name(dev uint32) string {
	if n, ok := d.cache[dev]; ok {
		return n
	}
	mm := devString(dev)
	name := mm
	if b, err := os.ReadFile(filepath.Join(d.sysRoot, "dev/block", mm, "uevent")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "DEVNAME="); ok && v != "" {
				name = v
			}
		}
	}
	if d.cache == nil {
		d.cache = map[uint32]string{}
	}
	d.cache[dev] = name
	return name
}

func devString(dev uint32) string {
	return fmt.Sprintf("%d:%d", dev>>20, dev&(1<<20-1))
}

// DiskOf returns the tracepoint device number (major<<20 | minor) of the whole disk that
// holds path: block tracepoints report disks, while stat reports the partition.
func DiskOf(path string) (uint32, string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, "", fmt.Errorf("stat %s: %w", path, err)
	}
	major, minor := unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev))
	sys, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))
	if err != nil {
		return 0, "", fmt.Errorf("%s is not on a block device (%d:%d): %w", path, major, minor, err)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(sys), "dev"))
		if err != nil {
			return 0, "", fmt.Errorf("parent of partition %d:%d: %w", major, minor, err)
		}
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
			return 0, "", fmt.Errorf("parse parent dev: %w", err)
		}
	}
	dev := major<<20 | minor
	return dev, (&devNames{sysRoot: "/sys"}).name(dev), nil
}

func pidAlive(procRoot string, pid int) bool {
	_, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(pid)))
	return err == nil
}
