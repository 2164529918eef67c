package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

var updateTransformShared = flag.Bool("update-transform-shared", false, "rewrite testdata/codec/transform's mode-3/4 golden vectors (manifest_shared.json)")

// sharedGolden is one case of manifest_shared.json: a basis packet (<basis>.basis) fitted
// from the module's first record, and a block of a later record coded on it.
type sharedGolden struct {
	transformGolden
	Basis string `json:"basis"`
	Mode  int    `json:"mode"`
}

// sharedRecords: two records of one "module" (the same directions, other rows), as bytes of dt.
func sharedRecords(rows, d int, dt dtype.DType, seed uint64) (fit, next []byte) {
	v := lowRank(2*rows, d, d/3, 0.3, seed)
	return toBytes(v[:rows*d], dt), toBytes(v[rows*d:], dt)
}

func encodeShared(t testing.TB, sb *SharedBasis, src []byte, dt dtype.DType, rowLen, skip int, bound float64) ([]byte, BlockStats) {
	t.Helper()
	c := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: bound}})
	rc, err := c.(RowPreparer).ForRows(src, dt, rowLen, skip)
	if err != nil {
		t.Fatal(err)
	}
	out, ok, st, err := rc.(BasisUser).WithBasis(sb).(StatsEncoder).EncodeStats(nil, src, dt)
	if err != nil || !ok {
		t.Fatalf("encode: ok=%v err=%v", ok, err)
	}
	return out, st
}

func TestTransformSharedRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dt    dtype.DType
		d     int
		bound float64
	}{
		{"float32 d64 cos0.995", dtype.Float32, 64, DefaultTransformBound},
		{"bfloat16 d96 0.05", dtype.BFloat16, 96, 0.05},
		{"float16 d48 0.02", dtype.Float16, 48, 0.02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fit, next := sharedRecords(200, tc.d, tc.dt, 5)
			sb, err := FitSharedBasis(fit, tc.dt, tc.d, tc.bound)
			if err != nil {
				t.Fatal(err)
			}
			if sb.K() != tc.d {
				t.Fatalf("basis of %d vectors, want the full rotation %d", sb.K(), tc.d)
			}
			again, err := ParseSharedBasis(sb.Packet())
			if err != nil || again.CRC() != sb.CRC() || again.Dim() != tc.d {
				t.Fatalf("parse: %v", err)
			}
			out, st := encodeShared(t, sb, next, tc.dt, tc.d, 0, tc.bound)
			if out[0] != modeShared {
				t.Fatalf("mode %d, want %d", out[0], modeShared)
			}
			if st.SharedMisses > 200/10 {
				t.Fatalf("%d of 200 rows missed the basis", st.SharedMisses)
			}
			// Decoded with the parsed packet (what a reader holds), every row in the bound.
			got, err := DecodeShared(nil, out, tc.dt, len(next), again)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := rowErrors(t, next, got, tc.dt, tc.d)
			for i, r := range rel {
				if r > tc.bound {
					t.Fatalf("row %d rel-L2 %g over %g", i, r, tc.bound)
				}
			}
			if rep := Report(LossyBound{Mode: "transform", Value: tc.bound}, []BlockStats{st}); rep.Exceeds() {
				t.Fatal("report exceeds the bound")
			}
			// Smaller than the same block with nothing shared.
			plain := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: tc.bound}})
			rc, _ := plain.(RowPreparer).ForRows(next, tc.dt, tc.d, 0)
			p, _, _ := rc.Encode(nil, next, tc.dt)
			if len(out) >= len(p) {
				t.Fatalf("shared %d bytes, per block %d", len(out), len(p))
			}
			// Without the basis, or with another module's, the block is refused by name.
			if _, err := DecodeShared(nil, out, tc.dt, len(next), nil); !errors.Is(err, ErrNeedBasis) {
				t.Fatalf("no basis: %v", err)
			}
			other, _ := sharedRecords(200, tc.d, tc.dt, 6)
			ob, _ := FitSharedBasis(other, tc.dt, tc.d, tc.bound)
			if _, err := DecodeShared(nil, out, tc.dt, len(next), ob); !errors.Is(err, ErrNeedBasis) {
				t.Fatalf("other basis: %v", err)
			}
			if _, err := registryDecode(out, tc.dt, len(next)); !errors.Is(err, ErrNeedBasis) {
				t.Fatalf("registry codec: %v", err)
			}
		})
	}
}

// registryDecode decodes with the registry's transform codec (no basis).
func registryDecode(src []byte, dt dtype.DType, n int) ([]byte, error) {
	c, err := ByID(Transform)
	if err != nil {
		return nil, err
	}
	return c.Decode(nil, src, dt, n)
}

// TestTransformSharedRowsOff: rows the basis cannot carry (another module's rows, cut rows at
// the block's edges) are coded directly in the same block, every row still in the bound, and
// a block the basis mostly misses is no bigger than without it.
func TestTransformSharedRowsOff(t *testing.T) {
	const d = 40
	fit, _ := sharedRecords(100, d, dtype.Float32, 7)
	sb, err := FitSharedBasis(fit, dtype.Float32, d, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	noise := toBytes(gen("heavy", 100*d, 8), dtype.Float32)
	src := toBytes(lowRank(100, d, 4, 0.01, 9), dtype.Float32)
	// A block cut mid-row on both sides (skip 5), then the heavy-tailed block.
	for _, b := range [][]byte{src[4*3 : 4*(100*d-11)], noise} {
		out, st := encodeShared(t, sb, b, dtype.Float32, d, 5, 0.05)
		got, err := DecodeShared(nil, out, dtype.Float32, len(b), sb)
		if err != nil {
			t.Fatal(err)
		}
		// Row parts: the first holds d-5 values, then whole rows.
		n := len(b) / 4
		cuts := []int{0}
		for c := d - 5; c < n; c += d {
			cuts = append(cuts, c)
		}
		cuts = append(cuts, n)
		for i := 1; i < len(cuts); i++ {
			lo, hi := cuts[i-1], cuts[i]
			var ss, sse float64
			for j := lo; j < hi; j++ {
				x, y := loadFloat(b, dtype.Float32, j), loadFloat(got, dtype.Float32, j)
				ss, sse = ss+x*x, sse+(x-y)*(x-y)
			}
			if sse > 0.05*0.05*ss {
				t.Fatalf("part %d rel-L2 %g", i, sse/ss)
			}
		}
		if st.SharedMisses == 0 && bytes.Equal(b, noise) {
			t.Log("heavy-tailed rows all carried by the basis")
		}
	}
	// A basis-less block's bytes do not depend on the basis offered when it is not used.
	out, st := encodeShared(t, sb, noise, dtype.Float32, d, 0, 0.05)
	plain := mustNew(t, "transform", Options{Lossy: &LossyBound{Mode: "transform", Value: 0.05}})
	rc, _ := plain.(RowPreparer).ForRows(noise, dtype.Float32, d, 0)
	p, _, _ := rc.Encode(nil, noise, dtype.Float32)
	if len(out) > len(p) && 2*st.SharedMisses > 100 {
		t.Fatalf("basis mostly missed: %d bytes against %d without it", len(out), len(p))
	}
}

func TestSharedBasisCorrupt(t *testing.T) {
	fit, next := sharedRecords(64, 32, dtype.Float32, 11)
	sb, err := FitSharedBasis(fit, dtype.Float32, 32, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	pkt := sb.Packet()
	mut := func(off int, v byte) []byte {
		b := bytes.Clone(pkt)
		b[off] = v
		return b
	}
	for name, b := range map[string][]byte{
		"empty": nil, "mode": mut(0, 4), "d 0": append([]byte{3, 0, 0, 0, 0}, pkt[5:]...),
		"k 0": mut(5, 0), "shift 16": mut(7, 16), "nan mean": append(append(bytes.Clone(pkt[:8]), 0, 0, 0xC0, 0x7F), pkt[12:]...),
		"truncated": pkt[:len(pkt)-2], "trailing": append(bytes.Clone(pkt), 0),
	} {
		if _, err := ParseSharedBasis(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	out, _ := encodeShared(t, sb, next, dtype.Float32, 32, 0, 0.1)
	for name, b := range map[string][]byte{
		"short":     out[:sharedHeader-1],
		"truncated": out[:len(out)-1],
		"trailing":  append(bytes.Clone(out), 0),
		"k":         func() []byte { b := bytes.Clone(out); b[9] = 33; return b }(),
		"groups 0":  func() []byte { b := bytes.Clone(out); b[11] = 0; return b }(),
	} {
		if _, err := DecodeShared(nil, b, dtype.Float32, len(next), sb); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := DecodeShared(nil, pkt, dtype.Float32, len(next), sb); !errors.Is(err, ErrCorrupt) {
		t.Errorf("basis packet as a block: %v", err)
	}
}

func sharedGoldenCases() []struct {
	sharedGolden
	fit, vals []float64
} {
	type c = struct {
		sharedGolden
		fit, vals []float64
	}
	lr := func(rows, d int, seed uint64) ([]float64, []float64) {
		v := lowRank(2*rows, d, d/3, 0.3, seed)
		return v[:rows*d], v[rows*d:]
	}
	f1, v1 := lr(120, 48, 41)
	f2, v2 := lr(80, 64, 42)
	f3, v3 := lr(64, 33, 43)
	// A block half off the module's rows: mode 4 with directly coded rows and channel groups.
	f4, v4 := lr(100, 40, 44)
	noise := gen("heavy", len(v4), 45)
	for r := 0; r < 100; r += 2 {
		for i := range 40 {
			v4[r*40+i] += 0.1 * noise[r*40+i]
		}
	}
	return []c{
		{sharedGolden{transformGolden{Name: "s_float32_120x48", Dtype: "float32", Bound: DefaultTransformBound, RowLen: 48}, "s_float32_120x48", modeShared}, f1, v1},
		{sharedGolden{transformGolden{Name: "s_bfloat16_80x64_skip9", Dtype: "bfloat16", Bound: 0.05, RowLen: 64, Skip: 9}, "s_bfloat16_80x64_skip9", modeShared}, f2, v2[9:]},
		{sharedGolden{transformGolden{Name: "s_float16_64x33", Dtype: "float16", Bound: 0.02, RowLen: 33}, "s_float16_64x33", modeShared}, f3, v3},
		{sharedGolden{transformGolden{Name: "s_mixed_float32_100x40", Dtype: "float32", Bound: 0.05, RowLen: 40}, "s_mixed_float32_100x40", modeShared}, f4, v4},
	}
}

// TestTransformSharedGolden: modes 3 and 4, decoded bit for bit from testdata and re-encoded to
// the same bytes (the Python reader is held to the same files).
func TestTransformSharedGolden(t *testing.T) {
	manifest := filepath.Join(transformGoldenDir, "manifest_shared.json")
	cases := sharedGoldenCases()
	if *updateTransformShared {
		var out []sharedGolden
		for _, gc := range cases {
			dt, _ := dtype.Parse(gc.Dtype)
			sb, err := FitSharedBasis(toBytes(gc.fit, dt), dt, gc.RowLen, gc.Bound)
			if err != nil {
				t.Fatal(err)
			}
			src := toBytes(gc.vals, dt)
			stored, _ := encodeShared(t, sb, src, dt, gc.RowLen, gc.Skip, gc.Bound)
			raw, err := DecodeShared(nil, stored, dt, len(src), sb)
			if err != nil {
				t.Fatal(err)
			}
			g := gc.sharedGolden
			g.RawLen, g.K, g.Mode = len(src), sb.K(), int(stored[0])
			write(t, filepath.Join(transformGoldenDir, g.Basis+".basis"), sb.Packet())
			write(t, filepath.Join(transformGoldenDir, g.Name+".fit"), toBytes(gc.fit, dt))
			write(t, filepath.Join(transformGoldenDir, g.Name+".stored"), stored)
			write(t, filepath.Join(transformGoldenDir, g.Name+".raw"), raw)
			write(t, filepath.Join(transformGoldenDir, g.Name+".src"), src)
			out = append(out, g)
		}
		j, _ := json.MarshalIndent(out, "", "  ")
		write(t, manifest, append(j, '\n'))
	}
	var got []sharedGolden
	if err := json.Unmarshal(read(t, manifest), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("manifest_shared.json has %d cases, code %d: run with -update-transform-shared", len(got), len(cases))
	}
	sawDirect := false
	for _, g := range got {
		t.Run(g.Name, func(t *testing.T) {
			dt, _ := dtype.Parse(g.Dtype)
			pkt := read(t, filepath.Join(transformGoldenDir, g.Basis+".basis"))
			stored := read(t, filepath.Join(transformGoldenDir, g.Name+".stored"))
			raw := read(t, filepath.Join(transformGoldenDir, g.Name+".raw"))
			src := read(t, filepath.Join(transformGoldenDir, g.Name+".src"))
			fit := read(t, filepath.Join(transformGoldenDir, g.Name+".fit"))
			if stored[0] != modeShared {
				t.Fatalf("mode %d", stored[0])
			}
			sb, err := ParseSharedBasis(pkt)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := DecodeShared(nil, stored, dt, g.RawLen, sb)
			if err != nil || !bytes.Equal(dec, raw) {
				t.Fatalf("decoded bytes differ from the golden raw file (err %v)", err)
			}
			// The fit and the encoder still write the same bytes.
			again, err := FitSharedBasis(fit, dt, g.RowLen, g.Bound)
			if err != nil || !bytes.Equal(again.Packet(), pkt) {
				t.Fatalf("refitting gave another basis packet (err %v)", err)
			}
			if out, _ := encodeShared(t, again, src, dt, g.RowLen, g.Skip, g.Bound); !bytes.Equal(out, stored) {
				t.Fatal("re-encoding gave other bytes")
			}
			_, kinds := sharedHead(t, stored, g.RawLen/dt.Size())
			for _, k := range kinds {
				if k == partDirect {
					sawDirect = true
				}
			}
		})
	}
	if !sawDirect {
		t.Fatal("no golden vector codes a row directly beside the basis")
	}
}

// sharedHead reads k and the part kinds of a mode-4 block.
func sharedHead(t *testing.T, b []byte, n int) (k int, kinds []byte) {
	t.Helper()
	rowLen := int(le32(b[1:]))
	first := int(le32(b[5:]))
	k = int(b[9]) | int(b[10])<<8
	g := 1 + (n-first+rowLen-1)/rowLen
	off := sharedHeader
	if b[11] > 1 {
		off += (rowLen + 1) / 2
	}
	pl, _, err := readPlanes(b[off:], 5, g)
	if err != nil {
		t.Fatal(err)
	}
	return k, pl[:g]
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// FuzzTransformSharedDecode: arbitrary bytes as a mode-4 block on a golden basis, and as a
// basis packet: an error or exactly rawLen bytes, never a panic.
func FuzzTransformSharedDecode(f *testing.F) {
	var gs []sharedGolden
	if j, err := os.ReadFile(filepath.Join(transformGoldenDir, "manifest_shared.json")); err == nil && json.Unmarshal(j, &gs) == nil {
		for _, g := range gs {
			dt, _ := dtype.Parse(g.Dtype)
			if b, err := os.ReadFile(filepath.Join(transformGoldenDir, g.Name+".stored")); err == nil {
				f.Add(b, uint8(dt), uint32(g.RawLen), false)
			}
			if b, err := os.ReadFile(filepath.Join(transformGoldenDir, g.Basis+".basis")); err == nil {
				f.Add(b, uint8(dt), uint32(g.RawLen), true)
			}
		}
	}
	fit, _ := sharedRecords(64, 32, dtype.Float32, 11)
	sb, err := FitSharedBasis(fit, dtype.Float32, 32, 0.1)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, dt uint8, rawLen uint32, asBasis bool) {
		if asBasis {
			if p, err := ParseSharedBasis(data); err == nil && (p.Dim() < 1 || p.K() > p.Dim()) {
				t.Fatalf("parsed basis of %d vectors of %d", p.K(), p.Dim())
			}
			return
		}
		n := int(rawLen % (1 << 20))
		out, err := DecodeShared([]byte("keep"), data, dtype.DType(dt%13), n, sb)
		if err == nil && (len(out) != 4+n || string(out[:4]) != "keep") {
			t.Fatalf("decoded %d bytes for raw length %d", len(out)-4, n)
		}
	})
}

// BenchmarkTransformShared: one record of 300 rows of 384 (MiniLM's layer-output shape),
// bf16, coded on a basis fitted from another record of the same directions.
func BenchmarkTransformShared(b *testing.B) {
	fit, next := sharedRecords(300, 384, dtype.BFloat16, 21)
	sb, err := FitSharedBasis(fit, dtype.BFloat16, 384, DefaultTransformBound)
	if err != nil {
		b.Fatal(err)
	}
	stored, _ := encodeShared(b, sb, next, dtype.BFloat16, 384, 0, DefaultTransformBound)
	b.Run("encode", func(b *testing.B) {
		c := mustNew(b, "transform", Options{})
		rc, _ := c.(RowPreparer).ForRows(next, dtype.BFloat16, 384, 0)
		sc := rc.(BasisUser).WithBasis(sb)
		b.ReportAllocs()
		b.SetBytes(int64(len(next)))
		var dst []byte
		for b.Loop() {
			out, ok, err := sc.Encode(dst[:0], next, dtype.BFloat16)
			if err != nil || !ok || len(out) != len(stored) {
				b.Fatalf("encode: %d bytes, ok %v, err %v", len(out), ok, err)
			}
			dst = out
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(next)))
		var dst []byte
		for b.Loop() {
			out, err := DecodeShared(dst[:0], stored, dtype.BFloat16, len(next), sb)
			if err != nil || len(out) != len(next) {
				b.Fatalf("decode: %d bytes, err %v", len(out), err)
			}
			dst = out
		}
	})
}
