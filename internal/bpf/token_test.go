package bpf

import "testing"

func TestTokenWindow(t *testing.T) {
	prev := ProcessTotals{OffCPU: OffCPU{RunnableNs: 10, SleepNs: 100, IONs: 5}, PageFaults: 7, SyscallCount: 3,
		SyscallTimed: 3, SyscallNs: 50, ReadBytes: 4096, WriteBytes: 0}
	for _, tc := range []struct {
		name string
		cur  ProcessTotals
		want TokenKernel
	}{
		{"grown", ProcessTotals{OffCPU: OffCPU{RunnableNs: 15, SleepNs: 300, IONs: 5}, PageFaults: 9, SyscallCount: 5,
			SyscallTimed: 4, SyscallNs: 250, ReadBytes: 8192, WriteBytes: 512},
			TokenKernel{OffCPUNs: 205, OffCPU: OffCPU{RunnableNs: 5, SleepNs: 200, BlockedNs: 200}, PageFaults: 2,
				SyscallCount: 2, SyscallTimed: 1, SyscallNs: 200, BlockReadBytes: 4096, BlockWriteBytes: 512}},
		// A removed thread entry makes the sleep sum go backwards: 0, not a lifetime total.
		{"sum went backwards", ProcessTotals{OffCPU: OffCPU{RunnableNs: 12, SleepNs: 40, IONs: 5}, PageFaults: 7,
			SyscallCount: 3, SyscallTimed: 3, SyscallNs: 50, ReadBytes: 4096},
			TokenKernel{OffCPUNs: 2, OffCPU: OffCPU{RunnableNs: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TokenWindow(prev, tc.cur); got != tc.want {
				t.Fatalf("TokenWindow = %+v, want %+v", got, tc.want)
			}
		})
	}
}
