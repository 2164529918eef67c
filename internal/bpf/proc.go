package bpf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProcFaults are the cumulative fault counters of /proc/<pid>/stat.
type ProcFaults struct {
	// Minor is minflt (field 10), Major is majflt (field 12).
	Minor, Major uint64
}

// ParseProcStat extracts the fault counters from the contents of /proc/<pid>/stat. The
// command name (field 2) may contain spaces and parentheses, so fields are counted from
// the last ')'.
func ParseProcStat(b []byte) (ProcFaults, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcFaults{}, fmt.Errorf("proc stat: no ')' after comm")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 10 {
		return ProcFaults{}, fmt.Errorf("proc stat: %d fields after comm, want >= 10", len(f))
	}
	minor, err := strconv.ParseUint(string(f[7]), 10, 64)
	if err != nil {
		return ProcFaults{}, fmt.Errorf("proc stat minflt: %w", err)
	}
	major, err := strconv.ParseUint(string(f[9]), 10, 64)
	if err != nil {
		return ProcFaults{}, fmt.Errorf("proc stat majflt: %w", err)
	}
	return ProcFaults{Minor: minor, Major: major}, nil
}

func readProcFaults(procRoot string, pid int) (ProcFaults, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return ProcFaults{}, err
	}
	return ParseProcStat(b)
}

// ctxSwitches sums voluntary/nonvoluntary_ctxt_switches over every thread of pid; the
// process-level status file only shows the leader thread's.
func ctxSwitches(procRoot string, pid int) (vol, invol uint64, err error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // thread exited between readdir and read
		}
		s := bufio.NewScanner(bytes.NewReader(b))
		for s.Scan() {
			k, v, ok := strings.Cut(s.Text(), ":")
			if !ok {
				continue
			}
			n, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if perr != nil {
				continue
			}
			switch k {
			case "voluntary_ctxt_switches":
				vol += n
			case "nonvoluntary_ctxt_switches":
				invol += n
			}
		}
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

// parseDiskstats parses /proc/diskstats (sectors are 512 bytes regardless of the device).
func parseDiskstats(b []byte) map[uint32]diskStat {
	out := map[uint32]diskStat{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 14 {
			continue
		}
		var n [14]uint64
		ok := true
		for i := range 14 {
			if i == 2 {
				continue
			}
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				ok = false
				break
			}
			n[i] = v
		}
		if !ok {
			continue
		}
		out[uint32(n[0]<<20|n[1])] = diskStat{
			name: f[2], reads: n[3], readBytes: n[5] * 512, writes: n[7], writeBytes: n[9] * 512,
			inflight: int64(n[11]),
		}
	}
	return out
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
