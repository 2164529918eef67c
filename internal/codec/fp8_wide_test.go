//go:build amd64 && !purego

package codec

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// TestFP8WideMatchesNarrow: the 8-wide loops (float32 lanes) store the same bytes and the
// same sums, bit for bit, as the 4-wide float64 loops whose output the golden streams
// hold: on every finite bfloat16 and float16 value under many scales, on values at and
// around every e4m3 midpoint times the scale (where rounding x·inv in float32 instead of
// float64 could pick the other neighbour), and on random rows of every kind.
func TestFP8WideMatchesNarrow(t *testing.T) {
	if !hasAVX2 || !fp8Wide {
		t.Skip("no AVX2 and FMA")
	}
	rng := rand.New(rand.NewPCG(40, 8))
	mids := fp8Midpoints()
	for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16, dtype.Float32} {
		var rows [][]float64
		// Scales: powers of two and small odd significands give exact products of x·inv
		// with few bits (exact e4m3 ties); the rest are arbitrary.
		var amaxes []float64
		for e := -20; e <= 20; e += 3 {
			for _, m := range []float64{1, 1.5, 1.75, 1.25, 1.375, 448.0 / 256, 0.875 * 2, 1.0078125} {
				amaxes = append(amaxes, math.Ldexp(m, e))
			}
		}
		for range 24 {
			amaxes = append(amaxes, math.Ldexp(1+rng.Float64(), rng.IntN(30)-15))
		}
		amaxes = append(amaxes, 448, 1, 65504, 6.1e-5, 3e38, 1.2e-36)
		for _, amax := range amaxes {
			amax = roundToDT(amax, dt)
			if math.IsInf(amax, 0) || amax == 0 || amax/448 < minNormalScale {
				continue
			}
			s := float64(float32(amax / e4m3Max))
			// Every e4m3 midpoint and grid value times s, rounded to dt, and its neighbours.
			var row []float64
			for _, q := range mids {
				v := roundToDT(q*s, dt)
				for k := -6; k <= 6; k++ {
					if w := stepUlps(v, k, dt); math.Abs(w) <= amax {
						row = append(row, w, -w)
					}
				}
			}
			row = append(row, amax, -amax, 0, math.Copysign(0, -1))
			rng.Shuffle(len(row), func(i, j int) { row[i], row[j] = row[j], row[i] })
			rows = append(rows, row)
			if dt != dtype.Float32 && rng.IntN(3) == 0 {
				rows = append(rows, every16(dt, amax, rng))
			}
		}
		for _, kind := range []string{"normal", "relu", "heavy", "outlier", "tiny"} {
			rows = append(rows, gen(kind, 4099, rng.Uint64()))
		}
		wide := []float64{} // a float32 row over most of its range
		for range 3001 {
			wide = append(wide, math.Ldexp(rng.NormFloat64(), rng.IntN(200)-100))
		}
		rows = append(rows, wide)

		lossless := 0
		for i, row := range rows {
			src := toBytes(row, dt)
			for _, rowLen := range []int{len(row), 61, 384} {
				c, err := mustNew(t, "fp8", Options{}).(RowPreparer).ForRows(src, dt, rowLen, 0)
				if err != nil {
					t.Fatal(err)
				}
				wideOut, okW, stW, err := c.(StatsEncoder).EncodeStats(nil, src, dt)
				if err != nil {
					t.Fatal(err)
				}
				fp8Wide = false
				narrowOut, okN, stN, err := c.(StatsEncoder).EncodeStats(nil, src, dt)
				fp8Wide = true
				if err != nil {
					t.Fatal(err)
				}
				if okW != okN || !bytes.Equal(wideOut, narrowOut) {
					t.Fatalf("%s row %d (%d values, rows of %d): stored forms differ", dt, i, len(row), rowLen)
				}
				if stW.Lossless { // a value fp8 does not take (float16 overflow): nothing to compare
					lossless++
					continue
				}
				if d := statsDiff(stW, stN); d != "" {
					t.Fatalf("%s row %d (rows of %d): %s", dt, i, rowLen, d)
				}
			}
		}
		if lossless > 6 { // float16: "outlier" overflows it (three row lengths each)
			t.Fatalf("%s: %d of %d rows stored losslessly", dt, lossless, 3*len(rows))
		}
	}
}

// fp8Midpoints is every non-negative e4m3 value and every midpoint between neighbours.
func fp8Midpoints() []float64 {
	v := refE4M3()
	out := append([]float64(nil), v...)
	for i := 1; i < len(v); i++ {
		out = append(out, (v[i-1]+v[i])/2)
	}
	return append(out, 464, 480)
}

// roundToDT rounds x to dt (round to nearest even), as toBytes stores it.
func roundToDT(x float64, dt dtype.DType) float64 {
	b := toBytes([]float64{x}, dt)
	switch dt {
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(uint16(b[0]) | uint16(b[1])<<8))
	case dtype.Float16:
		return float64(f16Table[uint16(b[0])|uint16(b[1])<<8])
	}
	return float64(float32(x))
}

// stepUlps is v moved k units in the last place of dt (v ≥ 0, finite).
func stepUlps(v float64, k int, dt dtype.DType) float64 {
	switch dt {
	case dtype.BFloat16:
		h := int(math.Float32bits(float32(v))>>16) + k
		if h < 0 || h >= 0x7f80 {
			return v
		}
		return float64(math.Float32frombits(uint32(h) << 16))
	case dtype.Float16:
		h := int(dtype.Float32ToFloat16(float32(v))) + k
		if h < 0 || h >= 0x7c00 {
			return v
		}
		return float64(f16Table[h])
	}
	u := int64(math.Float32bits(float32(v))) + int64(k)
	if u < 0 || u >= 0x7f800000 {
		return v
	}
	return float64(math.Float32frombits(uint32(u)))
}

// every16 is every finite bfloat16 or float16 value of magnitude ≤ amax, both signs,
// shuffled, with amax itself.
func every16(dt dtype.DType, amax float64, rng *rand.Rand) []float64 {
	var row []float64
	for h := range 0x8000 {
		var v float64
		if dt == dtype.BFloat16 {
			if h >= 0x7f80 {
				break
			}
			v = float64(math.Float32frombits(uint32(h) << 16))
		} else {
			if h >= 0x7c00 {
				break
			}
			v = float64(f16Table[h])
		}
		if v <= amax {
			row = append(row, v, -v)
		}
	}
	row = append(row, amax)
	rng.Shuffle(len(row), func(i, j int) { row[i], row[j] = row[j], row[i] })
	return row
}

// statsDiff describes the first field where a and b differ in any bit ("" if none).
func statsDiff(a, b BlockStats) string {
	same := func(p, q float64) bool { return math.Float64bits(p) == math.Float64bits(q) }
	if !same(a.SumSq, b.SumSq) || !same(a.SumSqErr, b.SumSqErr) || !same(a.MaxAbs, b.MaxAbs) {
		return "block sums differ"
	}
	if len(a.Rows) != len(b.Rows) {
		return "row counts differ"
	}
	for i := range a.Rows {
		p, q := a.Rows[i], b.Rows[i]
		if !same(p.SumSq, q.SumSq) || !same(p.SumSqErr, q.SumSqErr) || !same(p.Dot, q.Dot) || !same(p.SumSqDec, q.SumSqDec) {
			return "row sums differ"
		}
	}
	return ""
}
