package codec

import (
	"fmt"
	"testing"

	"github.com/klauspost/compress/huff0"

	"github.com/strap-llm/strap/internal/dtype"
)

// BenchmarkShufflePrefill encodes prefill-size blocks (a 16 KiB fp32 row of hidden 4096 up to
// the largest block) of real activations: the 24 decode records of testdata/records laid end
// to end and repeated to the size (the plane coder sees no matches, only byte counts, so the
// repeats cost what fresh data of the same statistics would).
func BenchmarkShufflePrefill(b *testing.B) {
	c, err := New("shuffle", Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		var real []byte
		for _, r := range decodeRecords(b, dt) {
			real = append(real, r...)
		}
		for _, size := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20, MaxBlockSize} {
			src := make([]byte, size)
			for i := 0; i < size; i += len(real) {
				copy(src[i:], real)
			}
			b.Run(fmt.Sprintf("%s/%dKiB", dt, size>>10), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(size))
				dst := make([]byte, 0, size+size/8)
				var out []byte
				cpu := processCPU()
				for b.Loop() {
					if out, _, err = c.Encode(dst[:0], src, dt); err != nil {
						b.Fatal(err)
					}
				}
				reportCPURate(b, cpu, size)
				b.ReportMetric(float64(size)/float64(len(out)), "ratio")
			})
		}
	}
}

// BenchmarkLargeHuffman codes the exponent plane (and the next one) of prefill-size blocks
// of real activations with huff0.Compress4X (what level 0 called before) and with the
// plane coder's countLarge + smallHuffman (the same bytes), in one binary so the two are
// measured under the same load.
func BenchmarkLargeHuffman(b *testing.B) {
	var real []byte
	for _, r := range decodeRecords(b, dtype.Float32) {
		real = append(real, r...)
	}
	for _, size := range []int{16 << 10, 64 << 10, 256 << 10, 512 << 10} {
		src := make([]byte, size)
		for i := 0; i < size; i += len(real) {
			copy(src[i:], real)
		}
		planes := make([]byte, size)
		shuffle(planes, src, 4, true)
		for _, j := range []int{3, 2} {
			p := planes[j*size/4 : (j+1)*size/4]
			p = p[:min(len(p), literalsChunk)]
			name := fmt.Sprintf("plane%d/%dKiB", j, len(p)>>10)
			b.Run(name+"/huff0", func(b *testing.B) {
				b.SetBytes(int64(len(p)))
				var s huff0.Scratch
				for b.Loop() {
					s.Reuse = huff0.ReusePolicyNone
					if _, _, err := huff0.Compress4X(p, &s); err != nil && err != huff0.ErrIncompressible {
						b.Fatal(err)
					}
				}
			})
			b.Run(name+"/counted", func(b *testing.B) {
				b.SetBytes(int64(len(p)))
				var s smallHuff
				for b.Loop() {
					s.countLarge(p)
					if _, err := s.smallHuffman(p, &s.counts.h); err != nil && err != huff0.ErrIncompressible {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
