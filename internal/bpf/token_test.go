package bpf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/trace"
)

func TestTokenWindow(t *testing.T) {
	prev := ProcessTotals{OffCPU: trace.OffCPU{RunnableNs: 10, SleepNs: 100, IONs: 5}, PageFaults: 7, SyscallCount: 3,
		SyscallTimed: 3, SyscallNs: 50, ReadBytes: 4096, WriteBytes: 0}
	for _, tc := range []struct {
		name string
		cur  ProcessTotals
		want trace.TokenKernel
	}{
		{"grown", ProcessTotals{OffCPU: trace.OffCPU{RunnableNs: 15, SleepNs: 300, IONs: 5}, PageFaults: 9, SyscallCount: 5,
			SyscallTimed: 4, SyscallNs: 250, ReadBytes: 8192, WriteBytes: 512},
			trace.TokenKernel{OffCPUNs: 205, OffCPU: trace.OffCPU{RunnableNs: 5, SleepNs: 200, BlockedNs: 200}, PageFaults: 2,
				SyscallCount: 2, SyscallTimed: 1, SyscallNs: 200, BlockReadBytes: 4096, BlockWriteBytes: 512}},
		// A removed thread entry makes the sleep sum go backwards: 0, not a lifetime total.
		{"sum went backwards", ProcessTotals{OffCPU: trace.OffCPU{RunnableNs: 12, SleepNs: 40, IONs: 5}, PageFaults: 7,
			SyscallCount: 3, SyscallTimed: 3, SyscallNs: 50, ReadBytes: 4096},
			trace.TokenKernel{OffCPUNs: 2, OffCPU: trace.OffCPU{RunnableNs: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TokenWindow(prev, tc.cur); got != tc.want {
				t.Fatalf("TokenWindow = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"0-3,8,10-11", []int{0, 1, 2, 3, 8, 10, 11}},
		{"", nil},
		{"5", []int{5}},
		{"3-1,x,2", []int{2}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := parseCPUList(tc.in)
			if len(got) != len(tc.want) {
				t.Fatalf("parseCPUList(%q) = %v, want %v", tc.in, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("parseCPUList(%q) = %v, want %v", tc.in, got, tc.want)
				}
			}
		})
	}
}

func TestReadCPUNodes(t *testing.T) {
	root := t.TempDir()
	for node, list := range map[string]string{"node0": "0-1\n", "node1": "2,3\n"} {
		d := filepath.Join(root, "devices/system/node", node)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cpulist"), []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := readCPUNodes(root)
	if len(got) != 4 || got[0] != 0 || got[1] != 0 || got[2] != 1 || got[3] != 1 || countNodes(got) != 2 {
		t.Fatalf("readCPUNodes = %v", got)
	}
	if n := readCPUNodes(t.TempDir()); len(n) != 0 || countNodes(n) != 0 {
		t.Fatalf("no node dirs: %v", n)
	}
}
