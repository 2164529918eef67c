//go:build linux && amd64

package bpf

import (
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkProbeEvents measures the probes' own cost: each iteration maps a page, faults
// it in and unmaps it as a watched process (sys_enter/sys_exit, page_fault_user), and
// the kernel's run statistics give ns per event for every program (events from the rest
// of the system count too: the figure is per event, whoever caused it).
func BenchmarkProbeEvents(b *testing.B) {
	c := startAttachedB(b)
	if err := c.Watch(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	c.Snapshot()
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	mapTouchUnmap(b)
	b.StopTimer()
	s := c.Snapshot()
	if s.StatsMissing() {
		b.Fatalf("no BPF run statistics: %s", c.Status().StatsError)
	}
	for _, p := range s.BPFStats {
		if p.Events > 0 {
			b.ReportMetric(p.NsPerEvent, p.Program+"-ns/event")
		}
	}
	if n := s.Syscalls[pidKey(os.Getpid())].MmapCount; n < uint64(b.N) {
		b.Fatalf("counted %d mmaps, want >= %d", n, b.N)
	}
}

// BenchmarkProbeEventsBaseline is BenchmarkProbeEvents' loop without probes: the
// difference in ns/op is the end-to-end overhead on a watched process.
func BenchmarkProbeEventsBaseline(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(4096)
	mapTouchUnmap(b)
}

func mapTouchUnmap(b *testing.B) {
	for range b.N {
		m, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			b.Fatal(err)
		}
		m[0] = 1
		if err := unix.Munmap(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot is the user-space cost of one interval: reading every map.
func BenchmarkSnapshot(b *testing.B) {
	c := startAttachedB(b)
	if err := c.Watch(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		if s := c.Snapshot(); len(s.Collectors) == 0 {
			b.Fatal("empty snapshot")
		}
	}
}

func startAttachedB(b *testing.B) *Collector {
	b.Helper()
	requireBPF(b)
	c, err := Start(Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	for _, st := range c.Status().Collectors {
		if st.Source != SourceBPF && st.Name != CollectorPressure && st.Name != CollectorMemory {
			b.Fatalf("collector %s not on bpf: %s", st.Name, st.Error)
		}
	}
	return c
}

// BenchmarkWriterWrite encodes and writes one full snapshot line per iteration.
func BenchmarkWriterWrite(b *testing.B) {
	s := sampleSnapshot()
	w := NewWriter(io.Discard, WriterOptions{})
	line, _ := jsonLine(s)
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for range b.N {
		if err := w.Write(s); err != nil {
			b.Fatal(err)
		}
	}
}
