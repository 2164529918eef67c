//go:build linux && amd64

package bpf

import (
	"io"
	"net"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
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
	reportProgStats(b, s)
	if n := s.Syscalls[pidKey(os.Getpid())].MmapCount; n < uint64(b.N) {
		b.Fatalf("counted %d mmaps, want >= %d", n, b.N)
	}
}

// reportProgStats reports, for every attached program, its runs per iteration and, when it
// ran, its ns per run: a program absent from the events columns was attached but not fired.
func reportProgStats(b *testing.B, s trace.Snapshot) {
	b.Helper()
	if s.StatsMissing() {
		b.Fatal("no BPF run statistics")
	}
	for _, p := range s.BPFStats {
		b.ReportMetric(float64(p.Events)/float64(b.N), p.Program+"-events/op")
		if p.Events > 0 {
			b.ReportMetric(p.NsPerEvent, p.Program+"-ns/event")
		}
	}
}

// BenchmarkProbeSockEvents is the network side of BenchmarkProbeEvents: each iteration a
// watched process sends 64 bytes over a loopback TCP connection and reads them back
// (sock_send_length, sock_recv_length, the read/write syscalls, the reader's wakeup).
func BenchmarkProbeSockEvents(b *testing.B) {
	c := startAttachedB(b)
	if err := c.Watch(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	tx, rx := tcpPair(b)
	c.Snapshot()
	b.ReportAllocs()
	b.SetBytes(64)
	b.ResetTimer()
	sendRecv(b, tx, rx)
	b.StopTimer()
	reportProgStats(b, c.Snapshot())
}

// BenchmarkProbeSockEventsBaseline is BenchmarkProbeSockEvents' loop without probes.
func BenchmarkProbeSockEventsBaseline(b *testing.B) {
	tx, rx := tcpPair(b)
	b.ReportAllocs()
	b.SetBytes(64)
	b.ResetTimer()
	sendRecv(b, tx, rx)
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	tx, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	rx, err := ln.Accept()
	if err != nil {
		tx.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { tx.Close(); rx.Close() })
	return tx, rx
}

func sendRecv(b *testing.B, tx, rx net.Conn) {
	msg := make([]byte, 64)
	got := make([]byte, 64)
	for range b.N {
		if _, err := tx.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(rx, got); err != nil {
			b.Fatal(err)
		}
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
		if st.Source != trace.SourceBPF && st.Name != trace.CollectorPressure && st.Name != trace.CollectorMemory {
			b.Fatalf("collector %s not on bpf: %s", st.Name, st.Error)
		}
	}
	return c
}

// BenchmarkProcessTotals is the daemon's cost per TOKEN of a traced session: one reading
// of the watched process's cumulative counters, from the kernel's per-process totals
// (TrackTotals, as for a session's client) and from the thread and syscall tables (a
// process watched without them). Both include the /proc/<pid>/io read.
func BenchmarkProcessTotals(b *testing.B) {
	for _, kernel := range []bool{true, false} {
		name := "tables"
		if kernel {
			name = "kernel-totals"
		}
		b.Run(name, func(b *testing.B) {
			c := startAttachedB(b)
			if err := c.Watch(os.Getpid()); err != nil {
				b.Fatal(err)
			}
			if kernel {
				if err := c.TrackTotals(os.Getpid()); err != nil {
					b.Fatal(err)
				}
			}
			mapTouchUnmap(&testing.B{N: 1000}) // some syscalls and faults to sum
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t, err := c.ProcessTotals(os.Getpid())
				if err != nil {
					b.Fatal(err)
				}
				if t.SyscallCount == 0 {
					b.Fatal("no syscalls counted")
				}
			}
		})
	}
}

// BenchmarkProbeOpenUnwatched is the cost the weight-open record adds to every process:
// an unwatched process opens and closes a file (sys_enter reads the path of every openat
// to look for a weight-file name; everything else returns at the watched filter).
func BenchmarkProbeOpenUnwatched(b *testing.B) {
	c := startAttachedB(b)
	c.Snapshot()
	b.ReportAllocs()
	b.ResetTimer()
	openClose(b)
	b.StopTimer()
	reportProgStats(b, c.Snapshot())
}

// BenchmarkProbeOpenUnwatchedBaseline is BenchmarkProbeOpenUnwatched's loop without probes.
func BenchmarkProbeOpenUnwatchedBaseline(b *testing.B) {
	b.ReportAllocs()
	openClose(b)
}

func openClose(b *testing.B) {
	path := []byte("/usr/lib/python3/dist-packages/model/config.json\x00")
	cwd := unix.AT_FDCWD
	for range b.N {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(cwd), uintptr(unsafe.Pointer(&path[0])), unix.O_RDONLY, 0, 0, 0)
		if errno == 0 {
			unix.Close(int(fd))
		}
	}
}
