package pipeline

import (
	"runtime"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// TestCPUBudgetBucket: compression may start while the bucket holds time, each one is
// charged what it took, the bucket refills at the budget's rate up to its burst, and every
// refusal is counted.
func TestCPUBudgetBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewCPUBudget(0.5)
	b.now = func() time.Time { return now }
	b.last = now
	if !b.take() {
		t.Fatal("a full bucket refused")
	}
	b.charge(80 * time.Millisecond) // 50 ms of burst at 0.5 CPU, now 30 ms in debt
	if b.take() || b.RawBlocks() != 1 {
		t.Fatalf("a bucket in debt allowed a block (raw %d)", b.RawBlocks())
	}
	now = now.Add(50 * time.Millisecond) // +25 ms: still 5 ms short
	if b.take() {
		t.Fatal("allowed before the debt was repaid")
	}
	now = now.Add(20 * time.Millisecond) // +10 ms: 5 ms ahead
	if !b.take() {
		t.Fatal("refused after the debt was repaid")
	}
	now = now.Add(time.Hour) // an idle spell fills the bucket to its burst only
	b.take()
	if b.tokens != 0.5*float64(cpuBurst) {
		t.Fatalf("bucket holds %v after an idle hour, want the burst %v", time.Duration(b.tokens), cpuBurst/2)
	}
	if b.RawBlocks() != 2 {
		t.Fatalf("%d raw blocks counted, want 2", b.RawBlocks())
	}
	var unlimited *CPUBudget
	if !unlimited.take() || unlimited.RawBlocks() != 0 {
		t.Fatal("a nil budget limited something")
	}
	unlimited.charge(time.Second)
}

// TestCPUBudgetZero: with no CPU for compression every block is stored raw, the file still
// reads back exactly, and the session and the budget count the blocks.
func TestCPUBudgetZero(t *testing.T) {
	for _, c := range []struct {
		name  string
		lossy *codec.LossyBound
	}{{"shuffle", nil}, {"quant", &codec.LossyBound{Mode: "abs", Value: 1e-3}}} {
		t.Run(c.name, func(t *testing.T) {
			cpu := NewCPUBudget(0)
			h := newHarness(t, hopts{codec: c.name, lossy: c.lossy, ringSize: shm.HeaderSize + 256<<10,
				blockSize: 16 << 10, cpu: cpu})
			var want []shm.Tensor
			for i := range 4 {
				tn := f32Tensor("t", uint64(i+1), 3<<10, 4) // 48 KiB: 3 blocks
				want = append(want, tn)
				if err := h.put(&tn); err != nil {
					t.Fatal(err)
				}
			}
			stats := h.s.Stats()
			res, err := h.finish(StatusComplete)
			if err != nil {
				t.Fatal(err)
			}
			if res.CPURawBlocks != 12 || cpu.RawBlocks() != 12 {
				t.Fatalf("raw blocks: session %d (%d before close), budget %d; want 12", res.CPURawBlocks,
					stats.CPURawBlocks, cpu.RawBlocks())
			}
			st, err := pipelinetest.ReadFile(h.out.Name())
			if err != nil {
				t.Fatal(err)
			}
			got, err := st.Tensors()
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if err := pipelinetest.Equal(got[i].Payload, want[i].Payload); err != nil {
					t.Fatalf("tensor %d: %v", i, err)
				}
			}
			if res.FileBytes < res.BytesIn {
				t.Fatalf("file %d bytes for %d raw: blocks were compressed", res.FileBytes, res.BytesIn)
			}
		})
	}
}

// TestMeterCountsCPU: the meter charges the CPU a job burns, not the time it waits.
func TestMeterCountsCPU(t *testing.T) {
	if _, ok := threadCPU(); !ok {
		t.Skip("no thread CPU clock")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	m := startMeter()
	time.Sleep(50 * time.Millisecond)
	if d := m.elapsed(); d > 20*time.Millisecond {
		t.Fatalf("a 50 ms sleep was charged %v", d)
	}
	m = startMeter()
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
	}
	if d := m.elapsed(); d <= 0 {
		t.Fatalf("30 ms of spinning was charged %v", d)
	}
}
