package pipeline

import (
	"errors"
	"testing"

	"github.com/strap-llm/strap/internal/shm"
)

// TestFitRing: the ring FitRing returns for free bytes leases within them (ring plus
// Reserve), a ring one page larger does not, and Budget.Open's refusal reports the free
// bytes FitRing is given.
func TestFitRing(t *testing.T) {
	for _, codec := range []string{"none", "lz4", "zstd"} {
		for _, bs := range []uint64{0, 64 << 10, 4 << 20} {
			p, err := Prepare(Request{RingSize: shm.HeaderSize + 4096, Codec: codec, Policy: "block", BlockSize: bs})
			if err != nil {
				t.Fatal(err)
			}
			need := func(ring uint64) int64 { return int64(ring) + Reserve(p.codec, p.bs, ring-shm.HeaderSize) }
			for _, free := range []int64{0, 4096, 8191, 8192, 3 << 20, 5<<20 + 12345, 300 << 20} {
				got := p.FitRing(free)
				switch {
				case got == 0:
					if need(2*4096) <= free {
						t.Errorf("%s bs %d free %d: FitRing 0, but a two-page ring needs only %d", codec, bs, free, need(2*4096))
					}
				case got%4096 != 0 || got <= shm.HeaderSize:
					t.Errorf("%s bs %d free %d: FitRing %d, want a multiple of 4096 over the header", codec, bs, free, got)
				case need(got) > free:
					t.Errorf("%s bs %d free %d: FitRing %d needs %d", codec, bs, free, got, need(got))
				case need(got+4096) <= free:
					t.Errorf("%s bs %d free %d: FitRing %d, but %d fits too", codec, bs, free, got, got+4096)
				}
			}
		}
	}

	b := NewBudget(10 << 20)
	l, err := b.Open(6<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = b.Open(4<<20, 0)
	var be *BudgetError
	if !errors.Is(err, ErrBudget) || !errors.As(err, &be) || be.Free() != 3<<20 || be.Ring != 4<<20 {
		t.Fatalf("refusal %v (%+v), want a BudgetError with 3 MiB free", err, be)
	}
}
