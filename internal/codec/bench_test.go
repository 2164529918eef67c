package codec

import (
	"fmt"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

const benchBlock = 1 << 20

func BenchmarkEncode(b *testing.B) {
	src := normalF32(benchBlock/4, 0.25, 11)
	for _, name := range []string{"lz4", "zstd"} {
		for _, level := range []int{0, 2} {
			c, err := New(name, Options{Level: level})
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/level%d", name, level), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(src)))
				dst := make([]byte, 0, 2*len(src))
				var out []byte
				for b.Loop() {
					var ok bool
					out, ok, err = c.Encode(dst[:0], src, dtype.Float32)
					if err != nil || !ok || len(out) == 0 {
						b.Fatalf("encode: %v ok=%v", err, ok)
					}
				}
				b.ReportMetric(float64(len(src))/float64(len(out)), "ratio")
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	src := normalF32(benchBlock/4, 0.25, 11)
	for _, name := range []string{"lz4", "zstd"} {
		c, err := New(name, Options{})
		if err != nil {
			b.Fatal(err)
		}
		enc, ok, err := c.Encode(nil, src, dtype.Float32)
		if err != nil || !ok {
			b.Fatalf("encode: %v ok=%v", err, ok)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := make([]byte, 0, len(src))
			for b.Loop() {
				out, err := c.Decode(dst[:0], enc, dtype.Float32, len(src))
				if err != nil || len(out) != len(src) {
					b.Fatalf("decode: %v", err)
				}
			}
		})
	}
}

func BenchmarkDecodePayload(b *testing.B) {
	raw := normalF32(8*benchBlock/4, 0.25, 12)
	for _, name := range []string{"lz4", "zstd"} {
		c, _ := New(name, Options{})
		p, err := EncodePayload(c, dtype.Float32, raw, benchBlock)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				out, err := DecodePayload(c, dtype.Float32, p, len(raw), benchBlock)
				if err != nil || len(out) != len(raw) {
					b.Fatal(err)
				}
			}
		})
	}
}
