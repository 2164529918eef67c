package pipeline

import (
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// TestMemoryHintClamp: the client's hint becomes the cap on a session's in-flight
// buffers, raised to its reserve (less could never compress the largest record) and
// lowered to the daemon's limit.
func TestMemoryHintClamp(t *testing.T) {
	const reserve = 1000
	for _, tc := range []struct {
		name  string
		limit int64
		hint  int64
		want  int64
	}{
		{"no hint", 0, 0, 0},
		{"hint kept", 0, 5000, 5000},
		{"raised to the reserve", 0, 10, reserve},
		{"lowered to the limit", 1 << 20, 1 << 30, 1 << 20},
		{"within the limit", 1 << 20, 4000, 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewBudget(tc.limit).Open(100, reserve)
			if err != nil {
				t.Fatal(err)
			}
			l.limitInFlight(tc.hint)
			if l.inFlightCap != tc.want {
				t.Fatalf("cap %d, want %d", l.inFlightCap, tc.want)
			}
		})
	}
}

// TestMemoryHintBoundsSession: with a slow writer, compressed blocks pile up waiting to be
// written. Without a hint they may take as much of the (unlimited) budget as they like;
// with the smallest hint the session's buffers never exceed its reserve, and every
// tensor still arrives intact.
func TestMemoryHintBoundsSession(t *testing.T) {
	const ring = shm.HeaderSize + 64<<10
	run := func(hint uint64) (peak, limit int64) {
		h := newHarness(t, hopts{codec: "zstd", ringSize: ring, blockSize: 4 << 10, memoryHint: hint,
			writeDelay: 2 * time.Millisecond})
		var want [][]byte
		for i := range 40 {
			tn := f32Tensor("m", uint64(i+1), 4096)
			want = append(want, tn.Payload)
			if err := h.put(&tn); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := h.finish(StatusComplete); err != nil {
			t.Fatal(err)
		}
		st, err := pipelinetest.ReadFile(h.out.Name())
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Tensors()
		if err != nil || len(got) != len(want) {
			t.Fatalf("%d tensors (%v), want %d", len(got), err, len(want))
		}
		for i := range got {
			if err := pipelinetest.Equal(got[i].Payload, want[i]); err != nil {
				t.Fatalf("tensor %d: %v", i, err)
			}
		}
		l := h.s.o.Lease
		return l.peak, l.inFlightCap
	}
	peak, limit := run(1)
	if limit != h0reserve(t, ring) {
		t.Fatalf("cap %d, want the reserve %d", limit, h0reserve(t, ring))
	}
	if peak > limit {
		t.Fatalf("in-flight buffers peaked at %d bytes, over the hinted cap %d", peak, limit)
	}
	free, _ := run(0)
	if free <= limit {
		t.Fatalf("without a hint buffers peaked at %d bytes, not above the cap %d: the test shows nothing", free, limit)
	}
	t.Logf("peak in-flight: %d bytes with the hint (cap %d), %d without", peak, limit, free)
}

// h0reserve is the reserve of a zstd session on a ring of ringSize with 4 KiB blocks.
func h0reserve(t *testing.T, ringSize uint64) int64 {
	t.Helper()
	plan, err := Prepare(Request{RingSize: ringSize, Codec: "zstd", BlockSize: 4 << 10, Policy: "block"})
	if err != nil {
		t.Fatal(err)
	}
	return Reserve(plan.codec, plan.bs, ringSize-shm.HeaderSize)
}
