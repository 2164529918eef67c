package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// refE4M3 lists the non-negative finite e4m3fn values by code (0x00–0x7E), built from the
// format's definition independently of E4M3: code e<<3|m is m·2⁻⁹ for e = 0 and
// (8+m)·2^(e−10) otherwise.
func refE4M3() []float64 {
	var v []float64
	for c := range 0x7F {
		e, m := c>>3, c&7
		if e == 0 {
			v = append(v, float64(m)/512)
		} else {
			v = append(v, float64(8+m)*math.Pow(2, float64(e-10)))
		}
	}
	return v
}

// refRound rounds r to e4m3fn by search: the nearer neighbour, a tie to the even code
// (even mantissa), anything from 448 up to 448; the sign kept.
func refRound(vals []float64, r float64) uint8 {
	var sign uint8
	if math.Signbit(r) {
		sign, r = 0x80, -r
	}
	if r >= 448 {
		return sign | 0x7E
	}
	i := sort.SearchFloat64s(vals, r) // vals[i-1] < r ≤ vals[i]
	if vals[i] == r {
		return sign | uint8(i)
	}
	lo, hi := vals[i-1], vals[i]
	switch {
	case r-lo < hi-r:
		return sign | uint8(i-1)
	case r-lo > hi-r:
		return sign | uint8(i)
	case (i-1)%2 == 0:
		return sign | uint8(i-1)
	default:
		return sign | uint8(i)
	}
}

func TestE4M3Table(t *testing.T) {
	vals := refE4M3()
	if vals[0x7E] != 448 || vals[1] != 0x1p-9 || vals[8] != 0x1p-6 {
		t.Fatalf("reference: max %g, min subnormal %g, min normal %g", vals[0x7E], vals[1], vals[8])
	}
	for c := range 256 {
		got := E4M3[c]
		if c&0x7F == 0x7F {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("code %#x: %g, want NaN", c, got)
			}
			continue
		}
		want := vals[c&0x7F]
		if c&0x80 != 0 {
			want = -want
		}
		if float64(got) != want || math.Signbit(float64(got)) != (c&0x80 != 0) {
			t.Fatalf("code %#x: %g, want %g", c, got, want)
		}
	}
}

func TestE4M3Rounding(t *testing.T) {
	vals := refE4M3()
	check := func(r float64) {
		t.Helper()
		if got, want := e4m3(r), refRound(vals, r); got != want {
			t.Fatalf("e4m3(%v) = %#x (%g), want %#x (%g)", r, got, E4M3[got], want, E4M3[want])
		}
	}
	// Every value, every midpoint between neighbours (the ties) and one ulp either side.
	for i, v := range vals {
		check(v)
		check(-v)
		if i > 0 {
			mid := (vals[i-1] + v) / 2
			for _, r := range []float64{mid, math.Nextafter(mid, 0), math.Nextafter(mid, 1e9)} {
				check(r)
				check(-r)
			}
		}
	}
	for _, r := range []float64{0, math.Copysign(0, -1), 448, 449, 463.99, 464, 480, 1e30, math.MaxFloat64,
		math.SmallestNonzeroFloat64, 0x1p-10, 0x1p-10 + 0x1p-60, 3 * 0x1p-10, 0x1p-6 - 0x1p-12, 0x1p-6 - 0x1p-11} {
		check(r)
		check(-r)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		r := math.Ldexp(rng.Float64(), rng.IntN(26)-14)
		if rng.IntN(2) == 0 {
			r = -r
		}
		check(r)
	}
}

// refDecode is the decoded element of a part with max |x| amax, independently of the
// codec: scale float32(amax/448), code the nearest e4m3 of x/scale, value float32(code·s)
// rounded to dt.
func refDecode(vals []float64, x, amax float64, dt dtype.DType) float64 {
	s := float32(amax / 448)
	var c uint8
	if s > 0 {
		c = refRound(vals, x/float64(s))
	} else if math.Signbit(x) {
		c = 0x80
	}
	v := float64(c & 0x7F)
	v = vals[int(v)]
	if c&0x80 != 0 {
		v = -v
	}
	f := float32(v) * s
	switch dt {
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(dtype.Float32ToBFloat16(f)))
	case dtype.Float16:
		return float64(dtype.Float16ToFloat32(dtype.Float32ToFloat16(f)))
	}
	return float64(f)
}

// fp8Encode runs what the pipeline does for a tensor with rows of rowLen values.
func fp8Encode(t testing.TB, c Codec, tensor []byte, dt dtype.DType, rowLen, blockSize int) ([][]byte, []BlockStats) {
	t.Helper()
	rc, err := c.(RowPreparer).ForRows(tensor, dt, rowLen, 0)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]byte
	var stats []BlockStats
	for off := 0; off < len(tensor); off += blockSize {
		src := tensor[off:min(off+blockSize, len(tensor))]
		out, ok, st, err := rc.(StatsEncoder).EncodeStats(nil, src, dt)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			out, st = nil, BlockStats{Values: len(src) / dt.Size(), Lossless: true}
		}
		blocks, stats = append(blocks, out), append(stats, st)
	}
	return blocks, stats
}

func TestFP8RoundTrip(t *testing.T) {
	vals := refE4M3()
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
		for _, kind := range []string{"normal", "heavy", "relu", "outlier"} {
			for _, shape := range [][2]int{{7, 384}, {3, 1000}, {40, 1}, {1, 5000}, {5, 3}} {
				for _, bs := range []int{1 << 20, 1020, 4096, 6} {
					rows, d := shape[0], shape[1]
					x := gen(kind, rows*d, uint64(d))
					if dt == dtype.Float16 {
						for i := range x {
							x[i] = math.Max(-6e4, math.Min(6e4, x[i]))
						}
					}
					src := toBytes(x, dt)
					bs := bs / dt.Size() * dt.Size()
					c := mustNew(t, "fp8", Options{})
					blocks, stats := fp8Encode(t, c, src, dt, d, bs)
					got := decodeTensor(t, c, blocks, src, dt, bs)
					w := dt.Size()
					// Every element equals the reference decode of its row part (rows
					// are cut where blocks are: each part has its own scale).
					for b := 0; b*bs < len(src); b++ {
						lo, hi := b*bs/w, min(len(src), (b+1)*bs)/w
						if blocks[b] == nil {
							t.Fatalf("%s %s %v bs %d: block %d stored raw", dt, kind, shape, bs, b)
						}
						for p := lo; p < hi; {
							q := min(hi, (p/d+1)*d)
							var amax float64
							for i := p; i < q; i++ {
								amax = max(amax, math.Abs(loadFloat(src, dt, i)))
							}
							for i := p; i < q; i++ {
								want := refDecode(vals, loadFloat(src, dt, i), amax, dt)
								if y := loadFloat(got, dt, i); y != want || math.Signbit(y) != math.Signbit(want) {
									t.Fatalf("%s %s %v bs %d: element %d = %g, want %g", dt, kind, shape, bs, i, y, want)
								}
							}
							p = q
						}
					}
					rep := Report(c.(LossyCodec).Bound(), stats)
					if rep.Rows == nil || rep.Rows.N != rows {
						t.Fatalf("%s %s %v bs %d: report rows %+v, want %d", dt, kind, shape, bs, rep.Rows, rows)
					}
					// The report's worst row is the worst row measured on the output.
					var worst float64
					minCos := 1.0
					for r := range rows {
						var ss, sse, dot, ssy float64
						for i := r * d; i < (r+1)*d; i++ {
							a, y := loadFloat(src, dt, i), loadFloat(got, dt, i)
							ss, sse, dot, ssy = ss+a*a, sse+(a-y)*(a-y), dot+a*y, ssy+y*y
						}
						if ss > 0 {
							worst = max(worst, math.Sqrt(sse/ss))
							minCos = min(minCos, dot/math.Sqrt(ss*ssy))
						}
					}
					if math.Abs(rep.Rows.RelL2Max-worst) > 1e-9*worst+1e-15 || math.Abs(rep.Rows.CosMin-minCos) > 1e-9 {
						t.Fatalf("%s %s %v bs %d: report max rel-L2 %g cos min %g, measured %g %g",
							dt, kind, shape, bs, rep.Rows.RelL2Max, rep.Rows.CosMin, worst, minCos)
					}
					if d >= 64 && (worst > 0.04 || minCos < 0.999) {
						t.Fatalf("%s %s %v: row rel-L2 %g, cosine %g", dt, kind, shape, worst, minCos)
					}
				}
			}
		}
	}
}

func TestFP8Ratio(t *testing.T) {
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		src := toBytes(gen("normal", 64*384, 3), dt)
		blocks, _ := fp8Encode(t, mustNew(t, "fp8", Options{}), src, dt, 384, 1<<20)
		stored := 0
		for _, b := range blocks {
			stored += len(b)
		}
		want := float64(dt.Size()*384) / 388
		if r := float64(len(src)) / float64(stored); math.Abs(r-want) > 0.01 {
			t.Fatalf("%s: ratio %.4f, want %.4f (one byte a value, 4 a row)", dt, r, want)
		}
	}
}

func TestFP8Special(t *testing.T) {
	c := mustNew(t, "fp8", Options{})
	dec := func(b []byte, dt dtype.DType, n int) []byte {
		t.Helper()
		out, err := c.Decode(nil, b, dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// NaN, ±inf: the block is stored losslessly and flagged, every byte kept.
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		x := gen("normal", 64, 1)
		x[10] = v
		src := toBytes(x, dtype.Float32)
		blocks, stats := fp8Encode(t, c, src, dtype.Float32, 16, 1<<20)
		if !stats[0].Lossless || blocks[0] != nil && blocks[0][0] != modeLossless {
			t.Fatalf("%v: not stored losslessly", v)
		}
		if blocks[0] != nil && !bytes.Equal(dec(blocks[0], dtype.Float32, len(src)), src) {
			t.Fatalf("%v: lossless block changed", v)
		}
	}
	// Zero rows (also -0) come back exactly; a row of float32 subnormals is lossless.
	x := make([]float64, 32)
	x[1] = math.Copysign(0, -1)
	x[20] = 3 // second row of 16
	src := toBytes(x, dtype.Float32)
	blocks, stats := fp8Encode(t, c, src, dtype.Float32, 16, 1<<20)
	if stats[0].Lossless || !bytes.Equal(dec(blocks[0], dtype.Float32, len(src)), src) {
		t.Fatalf("zero rows: lossless %v or changed", stats[0].Lossless)
	}
	x[5] = 1e-41
	_, stats = fp8Encode(t, c, toBytes(x, dtype.Float32), dtype.Float32, 16, 1<<20)
	if !stats[0].Lossless {
		t.Fatal("a row needing a subnormal scale was coded in fp8")
	}
	// Integer and float64 tensors are stored losslessly.
	for _, dt := range []dtype.DType{dtype.Int32, dtype.Float64, dtype.Uint8} {
		if _, stats := fp8Encode(t, c, toBytes(gen("normal", 64, 1), dt), dt, 8, 1<<20); !stats[0].Lossless {
			t.Fatalf("%s coded in fp8", dt)
		}
	}
	// A bound below what e4m3 achieves stores blocks losslessly; a loose one does not.
	src = toBytes(gen("normal", 4096, 2), dtype.Float32)
	tight := mustNew(t, "fp8", Options{Lossy: &LossyBound{Mode: "fp8", Value: 0.01}})
	if _, st := fp8Encode(t, tight, src, dtype.Float32, 256, 1<<20); !st[0].Lossless {
		t.Fatal("row rel-L2 bound 0.01 met by e4m3")
	}
	loose := mustNew(t, "fp8", Options{Lossy: &LossyBound{Mode: "fp8", Value: 0.04}})
	_, st := fp8Encode(t, loose, src, dtype.Float32, 256, 1<<20)
	if rep := Report(loose.(LossyCodec).Bound(), st); st[0].Lossless || rep.Exceeds() || rep.Rows.RelL2Max > 0.04 {
		t.Fatalf("bound 0.04: %+v %+v", st[0].Lossless, rep.Rows)
	}
}

func TestFP8Options(t *testing.T) {
	for _, o := range []Options{
		{Level: 1},
		{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}},
		{Lossy: &LossyBound{Mode: "fp8", Value: -1}},
		{Lossy: &LossyBound{Mode: "fp8", Value: math.NaN()}},
	} {
		if _, err := New("fp8", o); !errors.Is(err, ErrBadBound) && !errors.Is(err, ErrBadLevel) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
	if _, err := mustNew(t, "fp8", Options{}).(RowPreparer).ForRows(nil, dtype.Float32, 0, 0); err == nil {
		t.Fatal("row length 0 accepted")
	}
}

func TestFP8DecodeCorrupt(t *testing.T) {
	c := mustNew(t, "fp8", Options{})
	src := toBytes(gen("normal", 40, 1), dtype.Float32)
	blocks, _ := fp8Encode(t, c, src, dtype.Float32, 8, 1<<20)
	good := blocks[0]
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"short":     good[:5],
		"truncated": good[:len(good)-1],
		"long":      append(append([]byte(nil), good...), 0),
		"first 0":   mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[5:], 0); return b }),
		"first>row": mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[5:], 9); return b }),
		"NaN scale": mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[9:], 0x7fc00000); return b }),
		"neg scale": mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[9:], 0xbf800000); return b }),
		"inf scale": mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[9:], 0x7f800000); return b }),
		"NaN code":  mut(func(b []byte) []byte { b[len(b)-1] = 0xFF; return b }),
		"mode 2":    mut(func(b []byte) []byte { b[0] = 2; return b }),
	}
	for name, b := range cases {
		if _, err := c.Decode(nil, b, dtype.Float32, len(src)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := c.Decode(nil, good, dtype.Float64, len(src)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("float64: %v", err)
	}
}

// FuzzFP8Decode: any bytes decode to exactly rawLen bytes or give an error.
func FuzzFP8Decode(f *testing.F) {
	c, _ := New("fp8", Options{})
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
		src := toBytes(gen("heavy", 50, 1), dt)
		rc, _ := c.(RowPreparer).ForRows(src, dt, 8, 0)
		if b, ok, _ := rc.Encode(nil, src, dt); ok {
			f.Add(b, uint8(dt), uint16(len(src)))
		}
	}
	f.Add([]byte{1, 0}, uint8(dtype.Float32), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, dt uint8, rawLen uint16) {
		out, err := c.Decode([]byte("keep"), data, dtype.DType(dt%13), int(rawLen))
		if err != nil {
			return
		}
		if len(out) != 4+int(rawLen) || string(out[:4]) != "keep" {
			t.Fatalf("decoded %d bytes for raw length %d", len(out)-4, rawLen)
		}
	})
}

// FuzzFP8RoundTrip: arbitrary float32/bf16 bytes, any row length and block size: blocks
// with non-finite values come back bit for bit, the rest within e4m3's per-value error.
func FuzzFP8RoundTrip(f *testing.F) {
	f.Add(toBytes(gen("special", 64, 1), dtype.Float32), uint8(5), uint16(64), false)
	f.Add(toBytes(gen("heavy", 256, 1), dtype.Float32), uint8(17), uint16(100), true)
	f.Fuzz(func(t *testing.T, data []byte, rowLen uint8, bs uint16, bf bool) {
		dt := dtype.Float32
		if bf {
			dt = dtype.BFloat16
		}
		w := dt.Size()
		data = data[:len(data)/w*w]
		bsz := max(w, int(bs)/w*w)
		if len(data) == 0 {
			return
		}
		c := mustNew(t, "fp8", Options{})
		blocks, stats := fp8Encode(t, c, data, dt, int(rowLen)+1, bsz)
		got := decodeTensor(t, c, blocks, data, dt, bsz)
		for b, st := range stats {
			lo, hi := b*bsz, min(len(data), (b+1)*bsz)
			if st.Lossless {
				if !bytes.Equal(got[lo:hi], data[lo:hi]) {
					t.Fatal("lossless block changed")
				}
				continue
			}
			for i := lo / w; i < hi/w; i++ {
				x, y := loadFloat(data, dt, i), loadFloat(got, dt, i)
				if math.IsNaN(y) || math.IsInf(y, 0) || math.Abs(x-y) > st.MaxAbs {
					t.Fatalf("element %d: %g came back as %g (block max error %g)", i, x, y, st.MaxAbs)
				}
			}
		}
	})
}

func BenchmarkFP8(b *testing.B) {
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
		src := toBytes(gen("heavy", (1<<20)/dt.Size(), 5), dt) // 1 MiB
		c, _ := mustNew(b, "fp8", Options{}).(RowPreparer).ForRows(src, dt, 384, 0)
		stored, _, err := c.Encode(nil, src, dt)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(dt.String()+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := make([]byte, 0, len(src))
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu := threadCPU()
			for b.Loop() {
				out, ok, err := c.Encode(dst[:0], src, dt)
				if err != nil || !ok || len(out) != len(stored) {
					b.Fatalf("encode: %d bytes ok=%v err=%v", len(out), ok, err)
				}
			}
			// docs/COMPRESSION.md 10.1 states the target per CPU-second of one core.
			b.ReportMetric(float64(b.N)*float64(len(src))/(threadCPU()-cpu).Seconds()/1e9, "GB/cpu-s")
		})
		b.Run(dt.String()+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := make([]byte, 0, len(src))
			for b.Loop() {
				out, err := c.Decode(dst[:0], stored, dt, len(src))
				if err != nil || len(out) != len(src) {
					b.Fatalf("decode: %v", err)
				}
			}
		})
	}
}

// TestFP8VectorMatchesScalar: the AVX2 loops (fp8_amd64.s) store the same bytes as the
// scalar ones and the same sums (to rounding order), on values from every e4m3 range.
func TestFP8VectorMatchesScalar(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	vals := refE4M3()
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
		for n := 1; n < 300; n += 1 + n/4 {
			x := make([]float64, n)
			for i := range x {
				switch rng.IntN(5) {
				case 0: // a tie of e4m3 after scaling by a max of 448
					x[i] = (vals[1+rng.IntN(125)] + vals[rng.IntN(126)]) / 2
				case 1:
					x[i] = math.Ldexp(rng.Float64(), -rng.IntN(20)) // deep into the subnormal range
				case 2:
					x[i] = math.Copysign(0, -1)
				default:
					x[i] = rng.NormFloat64() * 100
				}
				if rng.IntN(2) == 0 {
					x[i] = -x[i]
				}
			}
			x[rng.IntN(n)] = 448
			src := toBytes(x, dt)
			c, _ := mustNew(t, "fp8", Options{}).(RowPreparer).ForRows(src, dt, n, 0)
			vec, okV, stV, err := c.(StatsEncoder).EncodeStats(nil, src, dt)
			if err != nil {
				t.Fatal(err)
			}
			hasAVX2 = false
			sc, okS, stS, err := c.(StatsEncoder).EncodeStats(nil, src, dt)
			hasAVX2 = true
			if err != nil {
				t.Fatal(err)
			}
			if okV != okS || !bytes.Equal(vec, sc) {
				t.Fatalf("%s n=%d: vector and scalar stored forms differ", dt, n)
			}
			a, b := stV.Rows[0], stS.Rows[0]
			near := func(p, q float64) bool { return math.Abs(p-q) <= 1e-12*math.Max(math.Abs(p), math.Abs(q)) }
			if !near(a.SumSq, b.SumSq) || !near(a.SumSqErr, b.SumSqErr) || !near(a.SumSqDec, b.SumSqDec) || stV.MaxAbs != stS.MaxAbs {
				t.Fatalf("%s n=%d: sums %+v max %g, scalar %+v max %g", dt, n, a, stV.MaxAbs, b, stS.MaxAbs)
			}
		}
	}
}

// TestFP8LongRows: rows longer than a block (a 1-D tensor, or a huge last dimension) are
// cut where blocks are; a PART that starts inside a row (skip) has a short first part.
func TestFP8LongRows(t *testing.T) {
	c := mustNew(t, "fp8", Options{})
	src := toBytes(gen("heavy", 3000, 4), dtype.Float32)
	for _, tc := range []struct{ rowLen, skip, bs, wantRows int }{
		{1 << 40, 0, 4000, 1}, // one row over 3 blocks: its parts are summed back together
		{3000, 0, 4000, 1},
		{1000, 400, 4000, 4}, // parts of 600, 1000, 1000, 400 values
	} {
		rc, err := c.(RowPreparer).ForRows(src, dtype.Float32, tc.rowLen, tc.skip)
		if err != nil {
			t.Fatal(err)
		}
		var stats []BlockStats
		for off := 0; off < len(src); off += tc.bs {
			b := src[off:min(off+tc.bs, len(src))]
			out, ok, st, err := rc.(StatsEncoder).EncodeStats(nil, b, dtype.Float32)
			if err != nil || !ok {
				t.Fatalf("%+v: ok %v err %v", tc, ok, err)
			}
			if got, err := c.Decode(nil, out, dtype.Float32, len(b)); err != nil || len(got) != len(b) {
				t.Fatalf("%+v: decode %v", tc, err)
			}
			if rl := binary.LittleEndian.Uint32(out[1:]); int(rl) > len(b)/4 && tc.rowLen > len(b)/4 {
				t.Fatalf("%+v: row_len %d stored for a block of %d values", tc, rl, len(b)/4)
			}
			stats = append(stats, st)
		}
		if first := stats[0].Rows; tc.skip > 0 && len(first) > 0 && !stats[0].FirstContinues {
			t.Fatalf("%+v: first part not marked as a continued row", tc)
		}
		if rep := Report(LossyBound{Mode: "fp8"}, stats); rep.Rows.N != tc.wantRows {
			t.Fatalf("%+v: %d rows, want %d", tc, rep.Rows.N, tc.wantRows)
		}
	}
}
