package codec

import (
	"fmt"
	"math"
	"os"
	"syscall"
	"testing"
	"time"

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

// shuffleCorpus is what BenchmarkShuffle encodes: 1 MiB of normal values as fp32 and as
// bf16 (the activation dtypes), with and without a quarter of zeros (the zero-map path).
func shuffleCorpus() []struct {
	name string
	dt   dtype.DType
	src  []byte
} {
	bf16 := func(f32 []byte) []byte {
		out := make([]byte, len(f32)/2)
		for i := range len(f32) / 4 {
			// Truncation keeps the test data independent of the codec's rounding.
			out[2*i], out[2*i+1] = f32[4*i+2], f32[4*i+3]
		}
		return out
	}
	return []struct {
		name string
		dt   dtype.DType
		src  []byte
	}{
		{"fp32", dtype.Float32, normalF32(benchBlock/4, 0, 21)},
		{"fp32-25%0", dtype.Float32, normalF32(benchBlock/4, 0.25, 22)},
		{"bf16", dtype.BFloat16, bf16(normalF32(benchBlock/2, 0, 23))},
		{"bf16-25%0", dtype.BFloat16, bf16(normalF32(benchBlock/2, 0.25, 24))},
	}
}

// BenchmarkShuffle measures the shuffle codec at its default level, one goroutine.
func BenchmarkShuffle(b *testing.B) {
	c, err := New("shuffle", Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range shuffleCorpus() {
		enc, ok, err := c.Encode(nil, tc.src, tc.dt)
		if err != nil || !ok {
			b.Fatalf("encode: %v ok=%v", err, ok)
		}
		ratio := float64(len(tc.src)) / float64(len(enc))
		b.Run("encode/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.src)))
			dst := make([]byte, 0, 2*len(tc.src))
			cpu := processCPU()
			for b.Loop() {
				if _, _, err := c.Encode(dst[:0], tc.src, tc.dt); err != nil {
					b.Fatal(err)
				}
			}
			reportCPURate(b, cpu, len(tc.src))
			b.ReportMetric(ratio, "ratio")
		})
		b.Run("decode/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.src)))
			dst := make([]byte, 0, len(tc.src))
			cpu := processCPU()
			for b.Loop() {
				if _, err := c.Decode(dst[:0], enc, tc.dt, len(tc.src)); err != nil {
					b.Fatal(err)
				}
			}
			reportCPURate(b, cpu, len(tc.src))
		})
	}
}

// processCPU is the CPU time this process has used (user + system, every thread, the
// garbage collector's included).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPURate reports MB per CPU-second since start: on a shared machine the wall-clock
// MB/s measures the neighbours' load, this the codec's cost per core.
func reportCPURate(b *testing.B, start time.Duration, size int) {
	if d := processCPU() - start; d > 0 {
		b.ReportMetric(float64(size)*float64(b.N)/1e6/d.Seconds(), "MB/cpu-s")
	}
}

// BenchmarkShuffleDecodeRecord encodes what one-token decode records are: 1×1×hidden fp32
// and bf16 activations, a few KiB each, where per-plane overhead rather than bytes decides.
func BenchmarkShuffleDecodeRecord(b *testing.B) {
	c, err := New("shuffle", Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, hidden := range []int{512, 1024, 4096} {
		for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
			src := normalF32(hidden, 0, uint64(hidden))
			if dt == dtype.BFloat16 {
				src = bf16FromF32(src)
			}
			b.Run(fmt.Sprintf("%s/hidden%d", dt, hidden), func(b *testing.B) {
				b.SetBytes(int64(len(src)))
				dst := make([]byte, 0, 2*len(src)+64)
				var out []byte
				cpu := processCPU()
				for b.Loop() {
					out, _, err = c.Encode(dst[:0], src, dt)
					if err != nil {
						b.Fatal(err)
					}
				}
				if d := processCPU() - cpu; d > 0 {
					b.ReportMetric(d.Seconds()*1e6/float64(b.N), "cpu-µs/record")
				}
				b.ReportMetric(float64(len(src))/float64(len(out)), "ratio")
			})
		}
	}
}

// bf16FromF32 rounds little-endian float32 values to bfloat16.
func bf16FromF32(src []byte) []byte {
	out := make([]byte, len(src)/2)
	for i := range len(src) / 4 {
		bits := uint32(src[4*i]) | uint32(src[4*i+1])<<8 | uint32(src[4*i+2])<<16 | uint32(src[4*i+3])<<24
		h := dtype.Float32ToBFloat16(math.Float32frombits(bits))
		out[2*i], out[2*i+1] = byte(h), byte(h>>8)
	}
	return out
}

// decodeRecords are the 24 records of one generated token (tenth step of greedy decoding,
// batch 1) of daemon_cost.py's random Llama (hidden 512 × 8 layers, seed 0): each layer's
// attention, MLP and block output, 1×1×512 fp32, in hook order. Unlike normalF32 their low
// mantissa planes are not quite flat (≈ 205 of 256 values in 512 bytes), which is what made
// huff0 build and refuse a table per record in strapd (issue 38).
func decodeRecords(tb testing.TB, dt dtype.DType) [][]byte {
	raw, err := os.ReadFile("testdata/records/llama512_decode_fp32.bin")
	if err != nil {
		tb.Fatal(err)
	}
	const rec = 512 * 4
	if len(raw) != 24*rec {
		tb.Fatalf("decode records: %d bytes, want %d", len(raw), 24*rec)
	}
	out := make([][]byte, 24)
	for i := range out {
		out[i] = raw[i*rec : (i+1)*rec]
		if dt == dtype.BFloat16 {
			out[i] = bf16FromF32(out[i])
		}
	}
	return out
}

// BenchmarkShuffleRealDecodeToken encodes one token's 24 real decode records (see
// decodeRecords) per iteration, as strapd does per generated token with `balanced`; ns/op
// divided by 24 is the codec's cost per record.
func BenchmarkShuffleRealDecodeToken(b *testing.B) {
	c, err := New("shuffle", Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		recs := decodeRecords(b, dt)
		b.Run(dt.String(), func(b *testing.B) {
			raw, stored := 0, 0
			for _, r := range recs {
				raw += len(r)
			}
			b.SetBytes(int64(raw))
			dst := make([]byte, 0, 2*len(recs[0])+64)
			cpu := processCPU()
			for b.Loop() {
				stored = 0
				for _, r := range recs {
					out, ok, err := c.Encode(dst[:0], r, dt)
					if err != nil {
						b.Fatal(err)
					}
					if !ok {
						out = r
					}
					stored += len(out)
				}
			}
			if d := processCPU() - cpu; d > 0 {
				b.ReportMetric(d.Seconds()*1e6/float64(b.N*len(recs)), "cpu-µs/record")
			}
			b.ReportMetric(float64(raw)/float64(stored), "ratio")
		})
	}
}
