package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

var (
	updateTransform        = flag.Bool("update-transform", false, "rewrite testdata/codec/transform's mode-0 golden vectors (manifest.json)")
	updateTransformGrouped = flag.Bool("update-transform-grouped", false, "rewrite testdata/codec/transform's mode-2 golden vectors (manifest_grouped.json)")
)

// withTransformMode makes the encoder write layout mode (modeLossy or modeGrouped) until the
// test ends.
func withTransformMode(t testing.TB, mode int) {
	old := transformMode
	transformMode = mode
	t.Cleanup(func() { transformMode = old })
}

const transformGoldenDir = "../../testdata/codec/transform"

// lowRank makes rows×d values: each row a mix of `rank` fixed directions (decaying
// weights, a per-row scale), plus noise of relative size `noise` and a mean offset; the
// shape of real activations, for which a basis pays.
func lowRank(rows, d, rank int, noise float64, seed uint64) []float64 {
	r := rand.New(rand.NewPCG(seed, 7))
	dirs := make([]float64, rank*d)
	for i := range dirs {
		dirs[i] = r.NormFloat64()
	}
	mean := make([]float64, d)
	for i := range mean {
		mean[i] = 0.3 * r.NormFloat64()
	}
	mean[d/3] = 20 // a "massive activation" channel
	v := make([]float64, rows*d)
	for t := range rows {
		row := v[t*d : (t+1)*d]
		scale := math.Exp(0.5 * r.NormFloat64())
		for j := range rank {
			c := r.NormFloat64() * scale / (1 + float64(j)/4)
			for i := range row {
				row[i] += c * dirs[j*d+i] / math.Sqrt(float64(d))
			}
		}
		for i := range row {
			row[i] += mean[i] + noise*scale*r.NormFloat64()/math.Sqrt(float64(d))
		}
	}
	return v
}

// rowErrors decodes blocks back to a tensor and returns every row's rel-L2 error and cosine.
func rowErrors(t *testing.T, src, got []byte, dt dtype.DType, rowLen int) (rel, cos []float64) {
	t.Helper()
	n := len(src) / dt.Size()
	for lo := 0; lo < n; lo += rowLen {
		hi := min(n, lo+rowLen)
		var ss, sse, sd, xy float64
		for i := lo; i < hi; i++ {
			x, y := loadFloat(src, dt, i), loadFloat(got, dt, i)
			ss, sse, sd, xy = ss+x*x, sse+(x-y)*(x-y), sd+y*y, xy+x*y
		}
		r := RowSums{SumSq: ss, SumSqErr: sse, Dot: xy, SumSqDec: sd}
		rel, cos = append(rel, r.relL2()), append(cos, r.cos())
	}
	return rel, cos
}

// transformHead reads k and the part kinds of a stored mode-0 or mode-2 block.
func transformHead(t *testing.T, b []byte, n int) (k int, kinds []byte) {
	t.Helper()
	if b[0] != modeLossy && b[0] != modeGrouped {
		return 0, nil
	}
	rowLen := int(binary.LittleEndian.Uint32(b[1:]))
	first := int(binary.LittleEndian.Uint32(b[5:]))
	k = int(binary.LittleEndian.Uint16(b[9:]))
	g := 1 + (n-first+rowLen-1)/rowLen
	off := transformHeader
	if k > 0 {
		off += 4 * rowLen
	}
	if b[0] == modeGrouped {
		off++
		if b[transformHeader] > 1 {
			off += (rowLen + 1) / 2
		}
		pl, _, err := readPlanes(b[off:], 5, g)
		if err != nil {
			t.Fatal(err)
		}
		return k, pl[:g]
	}
	return k, b[off : off+g]
}

func TestTransformRoundTrip(t *testing.T) {
	tests := []struct {
		name      string
		vals      []float64
		rowLen    int
		blockSize int
		bound     float64
		wantBasis bool
	}{
		{"lowrank-384-cos0.995", lowRank(600, 384, 12, 0.05, 1), 384, 1 << 18, DefaultTransformBound, true},
		{"lowrank-384-0.02", lowRank(600, 384, 12, 0.005, 2), 384, 1 << 18, 0.02, true},
		{"lowrank-96-rows-cut-by-blocks", lowRank(900, 96, 6, 0.05, 3), 96, 40000, 0.05, true},
		{"normal-1024", gen("normal", 64*1024, 4), 1024, 1 << 17, 0.1, false},
		{"heavy-64", gen("heavy", 300*64, 5), 64, 1 << 16, 0.05, false},
		{"relu-256", gen("relu", 200*256, 6), 256, 1 << 16, 0.03, false},
		{"one-row", gen("normal", 384, 7), 384, 1 << 20, 0.1, false},
		{"row-longer-than-block", gen("normal", 5000, 8), 5000, 4096, 0.1, false},
	}
	for _, tt := range tests {
		for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
			t.Run(tt.name+"/"+dt.String(), func(t *testing.T) {
				c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: tt.bound}})
				src := toBytes(tt.vals, dt)
				bs := tt.blockSize / dt.Size() * dt.Size()
				blocks, stats := fp8Encode(t, c, src, dt, tt.rowLen, bs)
				got := decodeTensor(t, c, blocks, src, dt, bs)
				rel, cos := rowErrors(t, src, got, dt, tt.rowLen)
				for i, r := range rel {
					if r > tt.bound {
						t.Fatalf("row %d: rel-L2 %.4g over the bound %.4g (cos %.6f)", i, r, tt.bound, cos[i])
					}
				}
				rep := Report(c.(LossyCodec).Bound(), stats)
				if rep.Exceeds() {
					t.Fatalf("report exceeds the bound: %+v", rep)
				}
				if rep.Rows == nil || rep.Rows.N != len(rel) {
					t.Fatalf("report rows %+v, want %d rows", rep.Rows, len(rel))
				}
				var worst float64
				for _, r := range rel {
					worst = max(worst, r)
				}
				if math.Abs(rep.Rows.RelL2Max-worst) > 1e-9*max(1, worst) {
					t.Fatalf("reported row rel-L2 max %.9g, measured %.9g", rep.Rows.RelL2Max, worst)
				}
				stored, basisBlocks := 0, 0
				for i, b := range blocks {
					if b == nil {
						t.Fatalf("block %d stored raw", i)
					}
					stored += len(b)
					if k, _ := transformHead(t, b, stats[i].Values); k > 0 {
						basisBlocks++
					}
				}
				if tt.wantBasis && basisBlocks == 0 {
					t.Fatal("no block used a basis on low-rank rows")
				}
				t.Logf("ratio %.2f, %d of %d blocks with a basis, row rel-L2 max %.4f", float64(len(src))/float64(stored), basisBlocks, len(blocks), worst)
			})
		}
	}
}

// TestTransformBasisPays: on low-rank rows the basis beats coding every value directly.
func TestTransformBasisPays(t *testing.T) {
	src := toBytes(lowRank(1000, 384, 16, 0.02, 9), dtype.BFloat16)
	c := mustNew(t, "transform", Options{})
	blocks, _ := fp8Encode(t, c, src, dtype.BFloat16, 384, len(src))
	ratio := float64(len(src)) / float64(len(blocks[0]))
	// Direct coding at rel-L2 0.1 costs ≈ 3.6 bits a value (4.4× vs bf16).
	if ratio < 8 {
		t.Fatalf("ratio %.2f on rank-16 rows, want ≥ 8", ratio)
	}
}

// TestTransformRefresh: a basis that misses the bound is not used for the rows it misses:
// rows outside the block's principal subspace are coded directly (part kind 0), the rows
// inside it on the basis; and a block whose rows change subspace gets a basis of its own.
func TestTransformRefresh(t *testing.T) {
	const d, rows = 128, 400
	v := lowRank(rows, d, 4, 0.01, 10)
	noise := gen("normal", rows*d, 11)
	for o := 0; o < rows; o += 10 { // every 10th row: a row plus noise far from the rank-4 subspace
		for i := range d {
			v[o*d+i] += 0.3 * noise[o*d+i]
		}
	}
	other := lowRank(rows, d, 4, 0.01, 12) // a second half from other directions
	v = append(v, other...)
	src := toBytes(v, dtype.Float32)
	c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: 0.05}})
	bs := rows * d * 4
	blocks, stats := fp8Encode(t, c, src, dtype.Float32, d, bs)
	if len(blocks) != 2 {
		t.Fatalf("%d blocks", len(blocks))
	}
	got := decodeTensor(t, c, blocks, src, dtype.Float32, bs)
	rel, _ := rowErrors(t, src, got, dtype.Float32, d)
	for i, r := range rel {
		if r > 0.05 {
			t.Fatalf("row %d: rel-L2 %.4g", i, r)
		}
	}
	for bi, b := range blocks {
		k, kinds := transformHead(t, b, stats[bi].Values)
		if k == 0 {
			t.Fatalf("block %d: no basis", bi)
		}
		direct := 0
		for r, kind := range kinds {
			if kind == partDirect {
				direct++
				if bi == 0 && r%10 != 0 {
					t.Errorf("block 0 row %d coded directly, not an outlier", r)
				}
			}
		}
		// An outlier's direction costs more in the basis than the row coded directly, so
		// most are left out of it.
		if bi == 0 && direct < 20 {
			t.Errorf("block 0: %d rows coded directly, want most of the 40 outliers", direct)
		}
		if bi == 1 && direct > 2 {
			t.Errorf("block 1: %d rows coded directly on its own basis", direct)
		}
	}
}

func TestTransformSpecial(t *testing.T) {
	c := mustNew(t, "transform", Options{})
	rc := func(src []byte, dt dtype.DType, rowLen int) StatsEncoder {
		r, err := c.(RowPreparer).ForRows(src, dt, rowLen, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.(StatsEncoder)
	}
	t.Run("nonfinite-lossless", func(t *testing.T) {
		src := toBytes(gen("special", 512, 1), dtype.Float32)
		out, ok, st, err := rc(src, dtype.Float32, 64).EncodeStats(nil, src, dtype.Float32)
		if err != nil || !ok || !st.Lossless || out[0] != modeLossless {
			t.Fatalf("ok=%v err=%v lossless=%v", ok, err, st.Lossless)
		}
		got, err := c.Decode(nil, out, dtype.Float32, len(src))
		if err != nil || !bytes.Equal(got, src) {
			t.Fatalf("lossless block changed: %v", err)
		}
	})
	t.Run("zero-rows", func(t *testing.T) {
		v := gen("normal", 64*32, 2)
		for i := 0; i < 32*64; i += 128 { // every other row zero
			clear(v[i : i+64])
		}
		src := toBytes(v, dtype.Float32)
		out, ok, st, err := rc(src, dtype.Float32, 64).EncodeStats(nil, src, dtype.Float32)
		if err != nil || !ok || st.Lossless {
			t.Fatalf("ok=%v err=%v", ok, err)
		}
		_, kinds := transformHead(t, out, len(v))
		for r, k := range kinds {
			if (r%2 == 0) != (k == partZero) {
				t.Fatalf("row %d kind %d", r, k)
			}
		}
		got, err := c.Decode(nil, out, dtype.Float32, len(src))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(v); i += 128 {
			if !bytes.Equal(got[4*i:4*(i+64)], make([]byte, 256)) {
				t.Fatalf("zero row at %d decoded non-zero", i)
			}
		}
	})
	t.Run("other-dtypes-lossless", func(t *testing.T) {
		for _, dt := range []dtype.DType{dtype.Float64, dtype.Int32, dtype.Uint8} {
			src := toBytes(gen("normal", 256, 3), dt)
			out, ok, st, err := c.(StatsEncoder).EncodeStats(nil, src, dt)
			if err != nil {
				t.Fatal(err)
			}
			if ok && (!st.Lossless || out[0] != modeLossless) {
				t.Fatalf("%s: not stored losslessly", dt)
			}
		}
	})
	t.Run("tiny-rows-lossless", func(t *testing.T) {
		v := gen("normal", 256, 4)
		for i := range v {
			v[i] *= 1e-40 // float32 subnormals: no normal float32 step fits
		}
		src := toBytes(v, dtype.Float32)
		_, ok, st, err := rc(src, dtype.Float32, 2).EncodeStats(nil, src, dtype.Float32)
		if err != nil || (ok && !st.Lossless) {
			t.Fatalf("rows of float32 subnormals: ok=%v lossless=%v err=%v", ok, st.Lossless, err)
		}
	})
}

func TestTransformOptions(t *testing.T) {
	for _, o := range []Options{
		{Level: 1},
		{Lossy: &LossyBound{Mode: "rel", Value: 0.1}},
		{Lossy: &LossyBound{Mode: "transform", Value: 0}},
		{Lossy: &LossyBound{Mode: "transform", Value: 1}},
		{Lossy: &LossyBound{Mode: "transform", Value: math.NaN()}},
		{Lossy: &LossyBound{Mode: "transform", Value: -0.1}},
	} {
		if _, err := New("transform", o); !errors.Is(err, ErrBadBound) && !errors.Is(err, ErrBadLevel) {
			t.Errorf("%+v: err %v", o, err)
		}
	}
	c := mustNew(t, "transform", Options{})
	if b := c.(LossyCodec).Bound(); b.Mode != "transform" || math.Abs(b.Value-0.09987) > 1e-4 {
		t.Fatalf("default bound %+v", b)
	}
}

func TestTransformDecodeCorrupt(t *testing.T) {
	withTransformMode(t, modeLossy) // the offsets below are mode 0's
	c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: 0.05}})
	v := lowRank(64, 64, 4, 0.05, 13)
	src := toBytes(v, dtype.Float32)
	rc, _ := c.(RowPreparer).ForRows(src, dtype.Float32, 64, 0)
	good, ok, err := rc.Encode(nil, src, dtype.Float32)
	if err != nil || !ok || good[0] != modeLossy {
		t.Fatalf("encode: ok=%v err=%v", ok, err)
	}
	if k, _ := transformHead(t, good, len(v)); k == 0 {
		t.Fatal("expected a basis block")
	}
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	kindOff := transformHeader + 4*64
	tests := map[string][]byte{
		"empty":       {},
		"bad mode":    mut(func(b []byte) []byte { b[0] = 7; return b }),
		"short":       good[:transformHeader-1],
		"truncated":   good[:len(good)-3],
		"trailing":    append(append([]byte(nil), good...), 0),
		"row_len 0":   mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[1:], 0); return b }),
		"first 0":     mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[5:], 0); return b }),
		"k too large": mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[9:], 65); return b }),
		"shift 16":    mut(func(b []byte) []byte { b[11] = 16; return b }),
		"width 4":     mut(func(b []byte) []byte { b[12] = 4; return b }),
		"kind 3":      mut(func(b []byte) []byte { b[kindOff] = 3; return b }),
		"nan mean":    mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[transformHeader:], 0x7fc00000); return b }),
		"step 0": mut(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[kindOff+64:], 0)
			return b
		}),
		"step inf": mut(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[kindOff+64:], 0x7f800000)
			return b
		}),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := c.Decode(nil, b, dtype.Float32, len(src)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err %v, want ErrCorrupt", err)
			}
		})
	}
	// k over row_len (k·row_len ≤ n still): refused before anything is allocated.
	over := []byte{0, 4, 0, 0, 0, 4, 0, 0, 0, 8, 0, 1, 1}
	if _, err := c.Decode(nil, over, dtype.Float32, 4*64); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("k over row_len: %v", err)
	}
	if _, err := c.Decode(nil, good, dtype.Int32, len(src)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("int32 dtype: %v", err)
	}
	if _, err := c.Decode(nil, good, dtype.Float32, len(src)+4); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("wrong raw length: %v", err)
	}
}

// TestTransformGroupedDecodeCorrupt: mode 2's own fields (group count, group map, the row
// parts' plane table, the integer runs) are checked before use.
func TestTransformGroupedDecodeCorrupt(t *testing.T) {
	c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: 0.1}})
	const d = 45 // odd: the map's last byte has a padding nibble
	v := gen("heavy", 64*d, 41)
	src := toBytes(v, dtype.Float32)
	rc, _ := c.(RowPreparer).ForRows(src, dtype.Float32, d, 0)
	good, ok, err := rc.Encode(nil, src, dtype.Float32)
	if err != nil || !ok || good[0] != modeGrouped || good[transformHeader] != 8 {
		t.Fatalf("encode: ok=%v err=%v head %v", ok, err, good[:transformHeader+1])
	}
	if k, _ := transformHead(t, good, len(v)); k != 0 {
		t.Fatalf("k %d on heavy-tailed noise", k)
	}
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	mapOff := transformHeader + 1
	tests := map[string][]byte{
		"short":          good[:transformHeader],
		"groups 0":       mut(func(b []byte) []byte { b[transformHeader] = 0; return b }),
		"groups 17":      mut(func(b []byte) []byte { b[transformHeader] = 17; return b }),
		"groups 1":       mut(func(b []byte) []byte { b[transformHeader] = 1; return b }),
		"group 8 of 8":   mut(func(b []byte) []byte { b[mapOff] = 0x80; return b }),
		"padding nibble": mut(func(b []byte) []byte { b[mapOff+d/2] |= 0x10; return b }),
		"truncated":      good[:len(good)-3],
		"trailing":       append(append([]byte(nil), good...), 0),
		"width 0":        mut(func(b []byte) []byte { b[12] = 0; return b }),
		"first 0":        mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[5:], 0); return b }),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := c.Decode(nil, b, dtype.Float32, len(src)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err %v, want ErrCorrupt", err)
			}
		})
	}
	// Mode 2 is transform's alone: fp8 and quant refuse it.
	for _, name := range []string{"fp8", "quant"} {
		o := Options{Lossy: &LossyBound{Mode: "rel", Value: 0.01}}
		if name == "fp8" {
			o = Options{}
		}
		cc := mustNew(t, name, o)
		if _, err := cc.Decode(nil, good, dtype.Float32, len(src)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s decoded a mode-2 block: %v", name, err)
		}
	}
}

// TestTransformGroupedSameValues: mode 2 stores mode 0's integers elsewhere, so where both
// encoders keep the same basis (or none) the decoded bytes are identical, and mode 2 is
// smaller on rows whose channels differ in spread.
func TestTransformGroupedSameValues(t *testing.T) {
	tests := []struct {
		name   string
		vals   []float64
		rowLen int
		dt     dtype.DType
	}{
		{"heavy-384-bf16", gen("heavy", 300*384, 42), 384, dtype.BFloat16},
		{"relu-256-f32", gen("relu", 200*256, 43), 256, dtype.Float32},
		{"lowrank-64-f16-skip", lowRank(500, 64, 6, 0.05, 44)[9:], 64, dtype.Float16},
		{"few-rows", gen("normal", 10*48, 45), 48, dtype.Float32}, // mode 0 here (see finishTransform)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := toBytes(tt.vals, tt.dt)
			enc := func(mode int) ([]byte, []byte) {
				withTransformMode(t, mode)
				c := mustNew(t, "transform", Options{})
				blocks, _ := fp8Encode(t, c, src, tt.dt, tt.rowLen, 1<<20)
				if len(blocks) != 1 || blocks[0] == nil {
					t.Fatalf("%d blocks", len(blocks))
				}
				return blocks[0], decodeTensor(t, c, blocks, src, tt.dt, 1<<20)
			}
			b0, d0 := enc(modeLossy)
			b2, d2 := enc(modeGrouped)
			k0, _ := transformHead(t, b0, len(tt.vals))
			k2, _ := transformHead(t, b2, len(tt.vals))
			want2 := modeGrouped
			if len(tt.vals)/tt.rowLen < minGroupedParts {
				want2 = modeLossy
			}
			if b0[0] != modeLossy || int(b2[0]) != want2 {
				t.Fatalf("modes %d, %d", b0[0], b2[0])
			}
			if k0 == k2 && !bytes.Equal(d0, d2) {
				t.Fatal("mode 2 decodes to other values than mode 0 with the same basis")
			}
			t.Logf("mode 0 %d bytes (k %d), mode 2 %d bytes (k %d, %d groups)", len(b0), k0, len(b2), k2, b2[transformHeader])
			if len(b2) > len(b0) {
				t.Errorf("mode 2 larger: %d > %d", len(b2), len(b0))
			}
		})
	}
}

// transformGolden is one golden vector of testdata/codec/transform (manifest.json).
type transformGolden struct {
	Name   string  `json:"name"`
	Dtype  string  `json:"dtype"`
	Bound  float64 `json:"bound"`
	RowLen int     `json:"row_len"`
	Skip   int     `json:"skip"`
	RawLen int     `json:"raw_len"`
	K      int     `json:"k"`
}

func transformGoldenCases() []struct {
	transformGolden
	vals []float64
} {
	type c = struct {
		transformGolden
		vals []float64
	}
	return []c{
		{transformGolden{Name: "lowrank_float32_96x48", Dtype: "float32", Bound: 0.05, RowLen: 48}, lowRank(96, 48, 5, 0.05, 21)},
		{transformGolden{Name: "lowrank_bfloat16_80x64", Dtype: "bfloat16", Bound: DefaultTransformBound, RowLen: 64}, lowRank(80, 64, 6, 0.05, 22)},
		{transformGolden{Name: "lowrank_float16_70x32_skip5", Dtype: "float16", Bound: 0.02, RowLen: 32, Skip: 5}, lowRank(70, 32, 4, 0.01, 23)[5:]},
		{transformGolden{Name: "heavy_float32_direct", Dtype: "float32", Bound: 0.1, RowLen: 40}, gen("heavy", 400, 24)},
		{transformGolden{Name: "zero_rows_float32", Dtype: "float32", Bound: 0.1, RowLen: 16}, append(make([]float64, 32), gen("normal", 64, 25)...)},
		{transformGolden{Name: "special_float32_lossless", Dtype: "float32", Bound: 0.1, RowLen: 8}, gen("special", 64, 26)},
	}
}

// TestTransformGolden holds the Go decoder to testdata/codec/transform (the Python decoder
// is held to the same files by clients/python/tests/test_transform_codec.py).
func TestTransformGolden(t *testing.T) {
	// Mode 0 (the layout written before issue 40's channel groups): still decoded bit for
	// bit, and the mode-0 encoder still writes the same bytes.
	goldenTransform(t, "manifest.json", transformGoldenCases(), modeLossy, *updateTransform)
}

// TestTransformGroupedGolden: mode 2, the layout the encoder writes.
func TestTransformGroupedGolden(t *testing.T) {
	goldenTransform(t, "manifest_grouped.json", transformGroupedGoldenCases(), modeGrouped, *updateTransformGrouped)
}

func transformGroupedGoldenCases() []struct {
	transformGolden
	vals []float64
} {
	type c = struct {
		transformGolden
		vals []float64
	}
	// Rows of a low-rank block with every third row pushed off its subspace: basis rows and
	// enough directly coded ones (34) for channel groups.
	mixed := lowRank(400, 40, 4, 0.005, 31)
	noise := gen("heavy", len(mixed), 32)
	for r := 0; r < 400; r += 3 {
		for i := range 40 {
			mixed[r*40+i] += 0.05 * noise[r*40+i]
		}
	}
	return []c{
		{transformGolden{Name: "g_heavy_bfloat16_64x45_skip7", Dtype: "bfloat16", Bound: DefaultTransformBound, RowLen: 45, Skip: 7}, gen("heavy", 64*45, 33)[7:]},
		{transformGolden{Name: "g_mixed_float16_400x40", Dtype: "float16", Bound: 0.05, RowLen: 40}, mixed},
		{transformGolden{Name: "g_lowrank_float32_96x48", Dtype: "float32", Bound: 0.05, RowLen: 48}, lowRank(96, 48, 5, 0.05, 34)},
		{transformGolden{Name: "g_zero_rows_float32_48x16", Dtype: "float32", Bound: 0.1, RowLen: 16}, append(make([]float64, 16*16), gen("normal", 32*16, 35)...)},
	}
}

func goldenTransform(t *testing.T, manifestName string, cases []struct {
	transformGolden
	vals []float64
}, mode int, update bool) {
	withTransformMode(t, mode)
	manifest := filepath.Join(transformGoldenDir, manifestName)
	if update {
		if err := os.MkdirAll(transformGoldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		var out []transformGolden
		for _, gc := range cases {
			dt, _ := dtype.Parse(gc.Dtype)
			src := toBytes(gc.vals, dt)
			c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: gc.Bound}})
			rc, err := c.(RowPreparer).ForRows(src, dt, gc.RowLen, gc.Skip)
			if err != nil {
				t.Fatal(err)
			}
			stored, ok, err := rc.Encode(nil, src, dt)
			if err != nil || !ok {
				t.Fatalf("%s: ok=%v err=%v", gc.Name, ok, err)
			}
			raw, err := c.Decode(nil, stored, dt, len(src))
			if err != nil {
				t.Fatal(err)
			}
			g := gc.transformGolden
			g.RawLen = len(src)
			g.K, _ = transformHead(t, stored, len(gc.vals))
			write(t, filepath.Join(transformGoldenDir, g.Name+".stored"), stored)
			write(t, filepath.Join(transformGoldenDir, g.Name+".raw"), raw)
			write(t, filepath.Join(transformGoldenDir, g.Name+".src"), src)
			out = append(out, g)
		}
		j, _ := json.MarshalIndent(out, "", "  ")
		write(t, manifest, append(j, '\n'))
	}
	var got []transformGolden
	if err := json.Unmarshal(read(t, manifest), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("%s has %d cases, code %d: run with -update-transform(-grouped)", manifestName, len(got), len(cases))
	}
	sawBasis, sawGroups := false, false
	for _, g := range got {
		t.Run(g.Name, func(t *testing.T) {
			dt, err := dtype.Parse(g.Dtype)
			if err != nil {
				t.Fatal(err)
			}
			stored := read(t, filepath.Join(transformGoldenDir, g.Name+".stored"))
			raw := read(t, filepath.Join(transformGoldenDir, g.Name+".raw"))
			src := read(t, filepath.Join(transformGoldenDir, g.Name+".src"))
			if stored[0] != modeLossless && int(stored[0]) != mode {
				t.Fatalf("mode %d in %s", stored[0], manifestName)
			}
			c, err := ByID(Transform)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := c.Decode(nil, stored, dt, g.RawLen)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dec, raw) {
				t.Fatal("decoded bytes differ from the golden raw file")
			}
			// The encoder still writes the same bytes (its output is a function of the block).
			cc := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: g.Bound}})
			rc, _ := cc.(RowPreparer).ForRows(src, dt, g.RowLen, g.Skip)
			again, _, err := rc.Encode(nil, src, dt)
			if err != nil || !bytes.Equal(again, stored) {
				t.Fatalf("re-encoding gave other bytes (err %v)", err)
			}
			if g.K > 0 {
				sawBasis = true
			}
			if stored[0] == modeGrouped && stored[transformHeader] > 1 {
				sawGroups = true
			}
		})
	}
	if !sawBasis {
		t.Fatal("no golden vector carries a basis")
	}
	if mode == modeGrouped && !sawGroups {
		t.Fatal("no golden vector has channel groups")
	}
}

// FuzzTransformDecode: any stored bytes (as read from disk) decode to exactly rawLen bytes
// or fail with an error; never a panic, a hang or an allocation beyond the block. Seeds are
// the golden vectors.
func FuzzTransformDecode(f *testing.F) {
	for _, m := range []string{"manifest.json", "manifest_grouped.json"} { // modes 0 and 2
		j, err := os.ReadFile(filepath.Join(transformGoldenDir, m))
		if err != nil {
			continue
		}
		var gs []transformGolden
		if json.Unmarshal(j, &gs) == nil {
			for _, g := range gs {
				dt, _ := dtype.Parse(g.Dtype)
				if b, err := os.ReadFile(filepath.Join(transformGoldenDir, g.Name+".stored")); err == nil {
					f.Add(b, uint8(dt), uint32(g.RawLen))
				}
			}
		}
	}
	f.Add([]byte{0, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(dtype.Float32), uint32(16))
	c, _ := ByID(Transform)
	f.Fuzz(func(t *testing.T, data []byte, dt uint8, rawLen uint32) {
		n := int(rawLen % (1 << 20))
		out, err := c.Decode([]byte("keep"), data, dtype.DType(dt%13), n)
		if err != nil {
			return
		}
		if len(out) != 4+n || string(out[:4]) != "keep" {
			t.Fatalf("decoded %d bytes for raw length %d", len(out)-4, n)
		}
	})
}

// FuzzTransformRoundTrip: arbitrary float32 or bfloat16 values, any row length, block size
// and bound: every row of the decoded tensor within the bound, or the block stored
// losslessly (then bit for bit).
func FuzzTransformRoundTrip(f *testing.F) {
	f.Add(toBytes(lowRank(40, 24, 3, 0.05, 1), dtype.Float32), uint8(24), uint16(2000), uint8(10), false)
	f.Add(toBytes(gen("heavy", 256, 1), dtype.Float32), uint8(17), uint16(100), uint8(3), true)
	// 40 whole rows of 32 in one block: mode 2 with channel groups.
	f.Add(toBytes(gen("heavy", 40*32, 2), dtype.Float32), uint8(32), uint16(40*32*2), uint8(19), true)
	f.Fuzz(func(t *testing.T, data []byte, rowLen uint8, bs uint16, b uint8, bf bool) {
		dt := dtype.Float32
		if bf {
			dt = dtype.BFloat16
		}
		data = data[:len(data)/dt.Size()*dt.Size()]
		if len(data) == 0 || rowLen == 0 {
			return
		}
		bound := 0.005 + float64(b%100)/200
		c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: bound}})
		blockSize := max(dt.Size(), int(bs)/dt.Size()*dt.Size())
		blocks, stats := fp8Encode(t, c, data, dt, int(rowLen), blockSize)
		got := decodeTensor(t, c, blocks, data, dt, blockSize)
		if Report(c.(LossyCodec).Bound(), stats).Exceeds() {
			t.Fatal("report exceeds the bound")
		}
		for i, blk := range blocks {
			lo, hi := i*blockSize, min(len(data), (i+1)*blockSize)
			if blk == nil || blk[0] == modeLossless {
				if !bytes.Equal(got[lo:hi], data[lo:hi]) {
					t.Fatalf("lossless block %d changed", i)
				}
			}
		}
		// Row parts: each part of each block within the bound, so each row is.
		n := len(data) / dt.Size()
		for lo := 0; lo < n; lo += int(rowLen) {
			hi := min(n, lo+int(rowLen))
			var ss, sse float64
			for i := lo; i < hi; i++ {
				x, y := loadFloat(data, dt, i), loadFloat(got, dt, i)
				if math.IsNaN(x) || math.IsInf(x, 0) {
					ss, sse = 1, 0 // such a row's blocks are lossless (checked above)
					break
				}
				ss, sse = ss+x*x, sse+(x-y)*(x-y)
			}
			if sse > bound*bound*ss*(1+1e-12) {
				t.Fatalf("row at %d: rel-L2 %.4g over %.4g", lo, math.Sqrt(sse/ss), bound)
			}
		}
	})
}

func BenchmarkTransform(b *testing.B) {
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		src := toBytes(lowRank(1<<20/384/dt.Size(), 384, 24, 0.05, 1), dt)
		c := mustNew(b, "transform", Options{})
		rc, _ := c.(RowPreparer).ForRows(src, dt, 384, 0)
		enc, _, _ := rc.Encode(nil, src, dt)
		b.Run("encode/"+dt.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			buf := make([]byte, 0, len(src))
			for b.Loop() {
				out, ok, err := rc.Encode(buf[:0], src, dt)
				if err != nil || !ok || len(out) != len(enc) {
					b.Fatalf("ok=%v err=%v", ok, err)
				}
			}
		})
		b.Run("decode/"+dt.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			buf := make([]byte, 0, len(src))
			for b.Loop() {
				out, err := c.Decode(buf[:0], enc, dt, len(src))
				if err != nil || len(out) != len(src) {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTransformNoHistory: a block's bytes do not depend on what the codec coded before (a
// resumed capture must equal the uninterrupted one byte for byte), nor on the other blocks
// of its record being coded at the same time.
func TestTransformNoHistory(t *testing.T) {
	a := toBytes(lowRank(300, 64, 5, 0.05, 31), dtype.Float32)
	b := toBytes(lowRank(300, 64, 9, 0.02, 32), dtype.Float32)
	c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: 0.05}})
	fresh, _ := fp8Encode(t, c, b, dtype.Float32, 64, 8192)
	fp8Encode(t, c, a, dtype.Float32, 64, 8192)
	after, _ := fp8Encode(t, c, b, dtype.Float32, 64, 8192)
	rc, _ := c.(RowPreparer).ForRows(b, dtype.Float32, 64, 0)
	concurrent := make([][]byte, len(fresh))
	done := make(chan int)
	for i := range fresh {
		go func() {
			out, _, _ := rc.Encode(nil, b[i*8192:min(len(b), (i+1)*8192)], dtype.Float32)
			concurrent[i] = out
			done <- i
		}()
	}
	for range fresh {
		<-done
	}
	for i := range fresh {
		if !bytes.Equal(fresh[i], after[i]) || !bytes.Equal(fresh[i], concurrent[i]) {
			t.Fatalf("block %d: bytes depend on what was coded before or beside it", i)
		}
	}
}

// miniLMRecord is one record of the MiniLM sample: its bytes and row length.
type miniLMRecord struct {
	src    []byte
	rowLen int
}

// miniLMRecords: the committed sample of real activations as two bfloat16 records, 288
// attention-output rows of 384 and 85 GELU rows of 1536.
func miniLMRecords(b *testing.B) []miniLMRecord {
	raw := read(b, "testdata/activation/minilm_sample.f32")
	v := make([]float64, len(raw)/4)
	for i := range v {
		v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
	}
	return []miniLMRecord{{toBytes(v[:110592], dtype.BFloat16), 384}, {toBytes(v[110592:110592+85*1536], dtype.BFloat16), 1536}}
}

// BenchmarkTransformMiniLM: the committed sample of real activations (TestRealActivations:
// 288 attention-output rows of 384, then GELU rows of 1536) as bfloat16 records, at the
// default bound (cosine 0.995).
func BenchmarkTransformMiniLM(b *testing.B) {
	recs := miniLMRecords(b)
	c := mustNew(b, "transform", Options{})
	var n int64
	for _, r := range recs {
		n += int64(len(r.src))
	}
	b.ReportAllocs()
	b.SetBytes(n)
	for b.Loop() {
		for _, r := range recs {
			rc, _ := c.(RowPreparer).ForRows(r.src, dtype.BFloat16, r.rowLen, 0)
			if _, ok, err := rc.Encode(nil, r.src, dtype.BFloat16); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	}
}

// BenchmarkTransformDecodeMiniLM: Go decode of the MiniLM sample's two bf16 records (288
// rows of 384, 85 of 1536) in each layout; MB/s of decoded bytes.
func BenchmarkTransformDecodeMiniLM(b *testing.B) {
	recs := miniLMRecords(b)
	for _, mode := range []int{modeLossy, modeGrouped} {
		b.Run(fmt.Sprintf("mode%d", mode), func(b *testing.B) {
			withTransformMode(b, mode)
			c := mustNew(b, "transform", Options{})
			var n int64
			stored := make([][]byte, len(recs))
			for i, r := range recs {
				rc, _ := c.(RowPreparer).ForRows(r.src, dtype.BFloat16, r.rowLen, 0)
				out, ok, err := rc.Encode(nil, r.src, dtype.BFloat16)
				if err != nil || !ok || int(out[0]) != mode {
					b.Fatal(ok, err)
				}
				stored[i] = out
				n += int64(len(r.src))
			}
			b.ReportAllocs()
			b.SetBytes(n)
			var dst []byte
			for b.Loop() {
				for i, r := range recs {
					var err error
					if dst, err = c.Decode(dst[:0], stored[i], dtype.BFloat16, len(r.src)); err != nil || len(dst) != len(r.src) {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
