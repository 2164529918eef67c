package trace

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/strap-llm/strap/internal/units"
)

// FormatText writes a human-readable rendering of s (strapd trace --no-output).
func FormatText(w io.Writer, s Snapshot) error {
	var b strings.Builder
	sess := "none"
	if len(s.Sessions) > 0 {
		var ids []string
		for _, x := range s.Sessions {
			ids = append(ids, x.ID)
		}
		sess = strings.Join(ids, ",")
	}
	fmt.Fprintf(&b, "── %s  interval %.2fs  sessions: %s\n", s.ISOTimestamp, s.IntervalS, sess)
	inflight := map[string]int64{}
	for _, d := range s.Inflight {
		inflight[d.DeviceName] = d.Count
	}
	for _, d := range s.BlockIO {
		fmt.Fprintf(&b, "  disk %-8s read %6.1f IOPS %9s/s  write %6.1f IOPS %9s/s  in-flight %d\n", d.DeviceName,
			d.ReadIOPS, units.Bytes(rate(d.ReadBytes, s.IntervalS)), d.WriteIOPS, units.Bytes(rate(d.WriteBytes, s.IntervalS)), inflight[d.DeviceName])
	}
	for _, h := range s.LatencyHistogram {
		fmt.Fprintf(&b, "    %s latency µs (%d):", h.DeviceName, h.Total)
		for _, k := range h.Buckets {
			fmt.Fprintf(&b, " [%d-%d]:%d", k.BucketLow, k.BucketHigh, k.Count)
		}
		b.WriteString("\n")
	}
	pids := map[string]bool{}
	for _, m := range []map[string]uint64{s.PageFaults, s.OffCPUNs} {
		for k := range m {
			pids[k] = true
		}
	}
	for k := range s.Sched {
		pids[k] = true
	}
	for k := range s.SyscallLatency {
		pids[k] = true
	}
	for k := range s.Memory {
		pids[k] = true
	}
	keys := slices.SortedFunc(maps.Keys(pids), func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	for _, pid := range keys {
		fmt.Fprintf(&b, "  pid %-7s", pid)
		if o, ok := s.OffCPU[pid]; ok {
			fmt.Fprintf(&b, " off-CPU runnable %s sleep %s io %s", dur(o.RunnableNs), dur(o.SleepNs), dur(o.IONs))
		}
		if f, ok := s.PageFaultsDetail[pid]; ok {
			fmt.Fprintf(&b, "  faults %d (minor %d major %d)", s.PageFaults[pid], f.Minor, f.Major)
		}
		if c, ok := s.Sched[pid]; ok {
			fmt.Fprintf(&b, "  csw vol %d invol %d migr %d", c.Voluntary, c.Involuntary, c.Migrations)
		}
		b.WriteString("\n")
		if sc, ok := s.Syscalls[pid]; ok && sc != (Syscalls{}) {
			fmt.Fprintf(&b, "           mmap %d (%s)  mlock %d (%s)  munlock %d (%s)  openat %d (%d failed)  nvidia opens %d\n",
				sc.MmapCount, units.Bytes(float64(sc.MmapBytes)), sc.MlockCount, units.Bytes(float64(sc.MlockBytes)),
				sc.MunlockCount, units.Bytes(float64(sc.MunlockBytes)), sc.OpenatCount, sc.OpenatFailed, sc.NvidiaOpens)
		}
		var extra []string
		if m, ok := s.Memory[pid]; ok {
			extra = append(extra, fmt.Sprintf("rss %s (peak %s)", units.Bytes(float64(m.RSSBytes)), units.Bytes(float64(m.RSSPeakBytes))))
		}
		if t, ok := s.TCP[pid]; ok {
			extra = append(extra, fmt.Sprintf("tcp tx %s rx %s retrans %d", units.Bytes(float64(t.TxBytes)), units.Bytes(float64(t.RxBytes)), t.Retransmits))
		}
		if l, ok := s.RunqueueLatency[pid]; ok {
			extra = append(extra, "runq "+latText(l))
		}
		if l, ok := s.NvidiaIoctl[pid]; ok {
			extra = append(extra, "nvidia ioctl "+latText(l))
		}
		if len(extra) > 0 {
			fmt.Fprintf(&b, "           %s\n", strings.Join(extra, "  "))
		}
		if m := s.SyncWait[pid]; len(m) > 0 {
			b.WriteString("           waits")
			for _, k := range slices.Sorted(maps.Keys(m)) {
				fmt.Fprintf(&b, "  %s %s", k, latText(m[k]))
			}
			b.WriteString("\n")
		}
		if m := s.SyscallLatency[pid]; len(m) > 0 {
			// The syscalls that took the most time, then the most frequent.
			names := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
				x, y := m[a], m[b]
				switch {
				case x.TotalNs != y.TotalNs:
					return cmpDesc(x.TotalNs, y.TotalNs)
				case x.Count != y.Count:
					return cmpDesc(x.Count, y.Count)
				}
				return strings.Compare(a, b)
			})
			b.WriteString("           syscalls")
			for i, k := range names {
				if i == 6 {
					fmt.Fprintf(&b, "  … %d more", len(names)-i)
					break
				}
				fmt.Fprintf(&b, "  %s %s", k, latText(m[k]))
			}
			b.WriteString("\n")
		}
	}
	for _, o := range s.DeviceOpens {
		fmt.Fprintf(&b, "  open pid %d tid %d %s -> %d\n", o.PID, o.TID, o.Path, o.Ret)
	}
	for _, r := range PSIResources {
		p, ok := s.Pressure[r]
		if !ok || p.Some == nil {
			continue
		}
		fmt.Fprintf(&b, "  pressure %-6s some %5.2f %5.2f %5.2f", r, p.Some.Avg10, p.Some.Avg60, p.Some.Avg300)
		if p.Full != nil {
			fmt.Fprintf(&b, "  full %5.2f %5.2f %5.2f", p.Full.Avg10, p.Full.Avg60, p.Full.Avg300)
		}
		b.WriteString("\n")
	}
	if len(s.BPFStats) > 0 {
		b.WriteString("  bpf")
		for _, p := range s.BPFStats {
			if p.Events > 0 {
				fmt.Fprintf(&b, " %s %d×%.0fns", p.Program, p.Events, p.NsPerEvent)
			}
		}
		b.WriteString("\n")
	}
	for _, k := range slices.Sorted(maps.Keys(s.Drops)) {
		fmt.Fprintf(&b, "  DROPPED %s: %d\n", k, s.Drops[k])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// latText renders LatencyStats as "12× (1 failed) mean 3ms max<4ms".
func latText(l LatencyStats) string {
	t := fmt.Sprintf("%d×", l.Count)
	if l.Errors > 0 {
		t += fmt.Sprintf(" (%d failed)", l.Errors)
	}
	if l.Timed > 0 {
		t += " mean " + dur(l.TotalNs/l.Timed)
		if n := len(l.Buckets); n > 0 {
			t += " max<" + dur((l.Buckets[n-1].BucketHigh+1)*1000)
		}
	}
	return t
}

func cmpDesc(a, b uint64) int {
	if a > b {
		return -1
	}
	if a < b {
		return 1
	}
	return 0
}

func rate(n uint64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(n) / secs
}

func dur(ns uint64) string { return time.Duration(ns).Round(time.Microsecond).String() }
