package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// fp8Client codes a tensor as a client does for an FP8 ring record, taking each row part's
// scale, codes and sums from fp8's own EncodeStats: the layout FP8Coded takes apart.
func fp8Client(t *testing.T, src []byte, dt dtype.DType, rowLen, blockValues int) (scales, sums, codes []byte, blocks [][]byte) {
	t.Helper()
	c, err := newFP8(Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := dt.Size()
	rc, err := c.(RowPreparer).ForRows(src, dt, rowLen, 0)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(src); off += blockValues * w {
		b := src[off:min(len(src), off+blockValues*w)]
		out, ok, st, err := rc.(StatsEncoder).EncodeStats(nil, b, dt)
		if err != nil || !ok {
			t.Fatalf("block at %d: ok %v, %v", off, ok, err)
		}
		g := len(st.Rows)
		scales = append(scales, out[fp8Header:fp8Header+4*g]...)
		codes = append(codes, out[fp8Header+4*g:]...)
		// The largest error of a part: the encoder reports only the block's, so measure it.
		first := int(binary.LittleEndian.Uint32(out[5:]))
		row := int(binary.LittleEndian.Uint32(out[1:]))
		dec, err := decodeFP8(nil, out, dt, len(b))
		if err != nil {
			t.Fatal(err)
		}
		n := len(b) / w
		for gi, lo := 0, 0; gi < g; gi++ {
			hi := min(n, first+gi*row)
			if gi == 0 {
				hi = first
			}
			mx := 0.0
			for i := lo; i < hi; i++ {
				mx = max(mx, math.Abs(elem(b, dt, i)-elem(dec, dt, i)))
			}
			r := st.Rows[gi]
			for _, v := range []float64{r.SumSq, r.SumSqErr, r.SumSqDec, mx} {
				sums = binary.LittleEndian.AppendUint64(sums, math.Float64bits(v))
			}
			lo = hi
		}
		blocks = append(blocks, out)
	}
	return scales, sums, codes, blocks
}

func elem(b []byte, dt dtype.DType, i int) float64 {
	switch dt {
	case dtype.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	default:
		return float64(f16Table[binary.LittleEndian.Uint16(b[2*i:])])
	}
}

// TestFP8CodedMatchesEncoder: the blocks FP8Coded builds from a client's codes, scales and
// sums are the bytes and stats of fp8's EncodeStats, for rows inside blocks, rows cut by
// block boundaries, rows longer than a block and a one-row tensor.
func TestFP8CodedMatchesEncoder(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 40))
	for _, tc := range []struct {
		name             string
		dt               dtype.DType
		rows, rowLen, bv int
	}{
		{"rows in blocks f32", dtype.Float32, 8, 16, 64},
		{"rows cut bf16", dtype.BFloat16, 7, 24, 40},
		{"row longer than block f16", dtype.Float16, 3, 100, 32},
		{"one row f32", dtype.Float32, 1, 50, 1 << 18},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.rows * tc.rowLen
			src := make([]byte, n*tc.dt.Size())
			for i := range n {
				v := float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
				if i/tc.rowLen == 1 {
					v = 0 // an all-zero row: scale 0
				}
				switch tc.dt {
				case dtype.Float32:
					binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
				case dtype.BFloat16:
					binary.LittleEndian.PutUint16(src[2*i:], dtype.Float32ToBFloat16(v))
				default:
					binary.LittleEndian.PutUint16(src[2*i:], dtype.Float32ToFloat16(v))
				}
			}
			scales, sums, codes, want := fp8Client(t, src, tc.dt, tc.rowLen, tc.bv)
			c, err := NewFP8Coded(tc.dt, n, tc.rowLen, tc.bv, 0, scales, sums, codes)
			if err != nil {
				t.Fatal(err)
			}
			if c.Blocks() != len(want) {
				t.Fatalf("%d blocks, want %d", c.Blocks(), len(want))
			}
			enc, _ := newFP8(Options{})
			rc, _ := enc.(RowPreparer).ForRows(src, tc.dt, tc.rowLen, 0)
			w := tc.dt.Size()
			for i := range want {
				got, st, err := c.Block(nil, i)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want[i]) || len(got) != c.BlockLen(i) {
					t.Fatalf("block %d differs from the encoder's (%d bytes, want %d)", i, len(got), len(want[i]))
				}
				_, _, ref, _ := rc.(StatsEncoder).EncodeStats(nil, src[i*tc.bv*w:min(len(src), (i+1)*tc.bv*w)], tc.dt)
				if st.SumSq != ref.SumSq || st.SumSqErr != ref.SumSqErr || st.MaxAbs != ref.MaxAbs ||
					st.FirstContinues != ref.FirstContinues || len(st.Rows) != len(ref.Rows) || st.Values != ref.Values {
					t.Fatalf("block %d stats %+v, encoder's %+v", i, st, ref)
				}
				for r := range st.Rows {
					if st.Rows[r] != ref.Rows[r] {
						t.Fatalf("block %d row part %d sums %+v, encoder's %+v", i, r, st.Rows[r], ref.Rows[r])
					}
				}
			}
		})
	}
}

// TestFP8CodedRefuses: every value a client may get wrong is an error naming it, and
// nothing a decoder would refuse becomes a block.
func TestFP8CodedRefuses(t *testing.T) {
	rowLen, n := 8, 16
	src := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(float32(i%5)*0.37-0.71))
	}
	scales, sums, codes, _ := fp8Client(t, src, dtype.Float32, rowLen, 64)
	le := binary.LittleEndian
	for _, tc := range []struct {
		name  string
		bound float64
		edit  func(sc, su, co []byte)
	}{
		{"nan code", 0, func(sc, su, co []byte) { co[3] = 0x7F }},
		{"negative nan code", 0, func(sc, su, co []byte) { co[9] = 0xFF }},
		{"negative scale", 0, func(sc, su, co []byte) { le.PutUint32(sc[4:], math.Float32bits(-1)) }},
		{"minus zero scale", 0, func(sc, su, co []byte) { le.PutUint32(sc, 0x80000000) }},
		{"nan scale", 0, func(sc, su, co []byte) { le.PutUint32(sc, 0x7fc00000) }},
		{"inf scale", 0, func(sc, su, co []byte) { le.PutUint32(sc, 0x7f800000) }},
		{"subnormal scale", 0, func(sc, su, co []byte) { le.PutUint32(sc, 1) }},
		{"zero scale with a code", 0, func(sc, su, co []byte) { le.PutUint32(sc, 0) }},
		{"negative sum", 0, func(sc, su, co []byte) { le.PutUint64(su[8:], math.Float64bits(-1)) }},
		{"nan max error", 0, func(sc, su, co []byte) { le.PutUint64(su[24:], math.Float64bits(math.NaN())) }},
		{"over the bound", 1e-9, func(sc, su, co []byte) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, su, co := bytes.Clone(scales), bytes.Clone(sums), bytes.Clone(codes)
			tc.edit(sc, su, co)
			c, err := NewFP8Coded(dtype.Float32, n, rowLen, 64, tc.bound, sc, su, co)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Block(nil, 0); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("accepted: %v", err)
			}
		})
	}
	if _, err := NewFP8Coded(dtype.Float32, n, rowLen, 64, 0, scales[:4], sums, codes); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a missing scale accepted: %v", err)
	}
	if _, err := NewFP8Coded(dtype.Int32, n, rowLen, 64, 0, scales, sums, codes); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("int32 accepted: %v", err)
	}
}
