package codec

import (
	"bytes"
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

var updateActivation = flag.Bool("update-activation", false, "rewrite testdata/codec/activation golden vectors")

const goldenDir = "../../testdata/codec/activation"

// --- data --------------------------------------------------------------------------------

// gen makes n float64 values of a named distribution, deterministically from seed.
func gen(kind string, n int, seed uint64) []float64 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	v := make([]float64, n)
	for i := range v {
		switch kind {
		case "normal":
			v[i] = r.NormFloat64()
		case "relu": // a quarter zeros, as after ReLU/GELU-ish
			v[i] = r.NormFloat64()
			if i%4 == 0 {
				v[i] = 0
			}
		case "heavy": // Laplace-times-lognormal: heavy tails
			v[i] = r.ExpFloat64() * math.Exp(r.NormFloat64()) * float64(1-2*(i&1))
		case "outlier": // channel 3 of 64 carries a 1e5× "massive activation"
			v[i] = r.NormFloat64()
			if i%64 == 3 {
				v[i] *= 1e5
			}
		case "zero":
			v[i] = 0
		case "tiny": // denormal range of fp32 and fp16
			v[i] = r.NormFloat64() * 1e-40
			if i%2 == 1 {
				v[i] = r.NormFloat64() * 1e-6
			}
		case "special":
			switch i % 8 {
			case 0:
				v[i] = math.NaN()
			case 1:
				v[i] = math.Inf(1)
			case 2:
				v[i] = math.Inf(-1)
			case 3:
				v[i] = math.Copysign(0, -1)
			case 4:
				v[i] = math.SmallestNonzeroFloat32 * float64(1+i%5)
			case 5:
				v[i] = 3e38 * float64(1-2*(i&1))
			default:
				v[i] = r.NormFloat64()
			}
		default:
			panic("unknown kind " + kind)
		}
	}
	return v
}

var kinds = []string{"normal", "relu", "heavy", "outlier", "zero", "tiny", "special"}

// toBytes stores values as elements of dt (floats rounded to dt, ints truncated).
func toBytes(v []float64, dt dtype.DType) []byte {
	w := dt.Size()
	b := make([]byte, len(v)*w)
	for i, x := range v {
		switch dt {
		case dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16:
			storeFloat(b, dt, i, x)
		default:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				x = 0
			}
			u := uint64(int64(math.Max(-1e18, math.Min(1e18, x*30))))
			for j := range w {
				b[i*w+j] = byte(u >> (8 * j))
			}
		}
	}
	return b
}

// --- pipeline emulation ------------------------------------------------------------------

// encodeTensor does what the pipeline does: ForTensor, split into blocks, EncodeStats,
// raw fallback. It returns the stored blocks (nil entry = stored raw) and the report.
func encodeTensor(t testing.TB, c Codec, tensor []byte, dt dtype.DType, blockSize int) ([][]byte, []BlockStats) {
	t.Helper()
	if tp, ok := c.(TensorPreparer); ok {
		var err error
		if c, err = tp.ForTensor(tensor, dt); err != nil {
			t.Fatalf("ForTensor: %v", err)
		}
	}
	var blocks [][]byte
	var stats []BlockStats
	for off := 0; off < len(tensor) || off == 0; off += blockSize {
		src := tensor[off:min(off+blockSize, len(tensor))]
		var (
			out []byte
			ok  bool
			st  BlockStats
			err error
		)
		if se, isSE := c.(StatsEncoder); isSE {
			out, ok, st, err = se.EncodeStats(nil, src, dt)
		} else {
			out, ok, err = c.Encode(nil, src, dt)
		}
		if err != nil {
			t.Fatalf("encode block at %d: %v", off, err)
		}
		if !ok {
			out = nil
			st = BlockStats{Values: len(src) / dt.Size(), Lossless: true}
			if quantizable(dt) {
				_, st.SumSq = sumSquares(src, dt)
			}
		}
		blocks = append(blocks, out)
		stats = append(stats, st)
		if len(tensor) == 0 {
			break
		}
	}
	return blocks, stats
}

func decodeTensor(t testing.TB, c Codec, blocks [][]byte, tensor []byte, dt dtype.DType, blockSize int) []byte {
	t.Helper()
	dec, err := ByID(c.ID())
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for i, b := range blocks {
		off := i * blockSize
		raw := min(blockSize, len(tensor)-off)
		if b == nil {
			out = append(out, tensor[off:off+raw]...)
			continue
		}
		if out, err = dec.Decode(out, b, dt, raw); err != nil {
			t.Fatalf("decode block %d: %v", i, err)
		}
	}
	if len(out) != len(tensor) {
		t.Fatalf("decoded %d bytes, want %d", len(out), len(tensor))
	}
	return out
}

// measure compares decoded to original element by element: non-finite values must come
// back bit for bit; it returns the max-abs and rel-L2 error over finite values.
func measure(t testing.TB, orig, got []byte, dt dtype.DType) (maxAbs, relL2 float64) {
	t.Helper()
	w := dt.Size()
	var sse, ss float64
	for i := range len(orig) / w {
		x, y := loadFloat(orig, dt, i), loadFloat(got, dt, i)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			if !bytes.Equal(orig[i*w:(i+1)*w], got[i*w:(i+1)*w]) {
				t.Fatalf("element %d: non-finite %v came back as %v", i, x, y)
			}
			continue
		}
		if math.IsNaN(y) || math.IsInf(y, 0) {
			t.Fatalf("element %d: finite %v came back as %v", i, x, y)
		}
		e := math.Abs(x - y)
		maxAbs = max(maxAbs, e)
		sse += e * e
		ss += x * x
	}
	if ss > 0 {
		relL2 = math.Sqrt(sse / ss)
	}
	return maxAbs, relL2
}

func mustNew(t testing.TB, name string, o Options) Codec {
	t.Helper()
	c, err := New(name, o)
	if err != nil {
		t.Fatalf("New(%s): %v", name, err)
	}
	return c
}

// --- tests -------------------------------------------------------------------------------

var allDtypes = []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16,
	dtype.Int8, dtype.Uint8, dtype.Int16, dtype.Int32, dtype.Int64, dtype.Bool,
	dtype.Float8E4M3, dtype.Float8E5M2}

func TestActivationLosslessRoundTrip(t *testing.T) {
	codecs := []struct {
		name string
		o    Options
	}{
		{"shuffle", Options{}},
		{"shuffle", Options{Level: 1}},
		{"shuffle", Options{Level: 3}},
	}
	for _, cc := range codecs {
		for _, dt := range allDtypes {
			for _, kind := range kinds {
				for _, n := range []int{0, 1, 7, 3000} {
					t.Run(fmt.Sprintf("%s%d/%s/%s/%d", cc.name, cc.o.Level, dt, kind, n), func(t *testing.T) {
						c := mustNew(t, cc.name, cc.o)
						tensor := toBytes(gen(kind, n, uint64(n)), dt)
						if dt == dtype.Bool {
							for i := range tensor {
								tensor[i] &= 1
							}
						}
						blocks, _ := encodeTensor(t, c, tensor, dt, 4096)
						got := decodeTensor(t, c, blocks, tensor, dt, 4096)
						if !bytes.Equal(got, tensor) {
							t.Fatal("lossless round trip changed bytes")
						}
					})
				}
			}
		}
	}
}

// TestShuffleOddLength covers a block whose length is not a multiple of the element size.
func TestShuffleOddLength(t *testing.T) {
	c := mustNew(t, "shuffle", Options{})
	src := toBytes(gen("relu", 4000, 1), dtype.Float32)[:15999]
	out, ok, err := c.Encode(nil, src, dtype.Float32)
	if err != nil || !ok {
		t.Fatalf("encode: ok=%v err=%v", ok, err)
	}
	got, err := c.Decode(nil, out, dtype.Float32, len(src))
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("odd length round trip: %v", err)
	}
}

func lossyCodecs() []struct {
	name string
	o    Options
} {
	return []struct {
		name string
		o    Options
	}{
		{"quant", Options{Lossy: &LossyBound{Mode: "abs", Value: 1e-3}}},
		{"quant", Options{Lossy: &LossyBound{Mode: "abs", Value: 0.5}}},
		{"quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}}},
		{"quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-2}, Level: 3}},
		{"fp16", Options{}},
		{"fp16", Options{Lossy: &LossyBound{Mode: "fp16", Value: 1e-3}}},
	}
}

func checkBound(t testing.TB, b *LossyBound, maxAbs, relL2 float64) {
	t.Helper()
	if b == nil {
		return
	}
	switch b.Mode {
	case "abs":
		if maxAbs > b.Value {
			t.Fatalf("max-abs error %g exceeds bound %g", maxAbs, b.Value)
		}
	case "rel", "fp16":
		if b.Value > 0 && relL2 > b.Value {
			t.Fatalf("rel-L2 error %g exceeds bound %g", relL2, b.Value)
		}
	}
}

func TestActivationLossyRoundTrip(t *testing.T) {
	for _, cc := range lossyCodecs() {
		for _, dt := range allDtypes {
			for _, kind := range kinds {
				name := cc.name
				if cc.o.Lossy != nil {
					name += fmt.Sprintf("-%s%g", cc.o.Lossy.Mode, cc.o.Lossy.Value)
				}
				t.Run(fmt.Sprintf("%s/%s/%s", name, dt, kind), func(t *testing.T) {
					c := mustNew(t, cc.name, cc.o)
					tensor := toBytes(gen(kind, 5000, 7), dt)
					blocks, stats := encodeTensor(t, c, tensor, dt, 4096)
					got := decodeTensor(t, c, blocks, tensor, dt, 4096)
					if !quantizable(dt) {
						if !bytes.Equal(got, tensor) {
							t.Fatal("non-float dtype must be stored losslessly")
						}
						return
					}
					maxAbs, relL2 := measure(t, tensor, got, dt)
					checkBound(t, cc.o.Lossy, maxAbs, relL2)
					bound := c.(LossyCodec).Bound()
					if cc.o.Lossy != nil && bound != *cc.o.Lossy {
						t.Fatalf("Bound() = %+v, built with %+v", bound, *cc.o.Lossy)
					}
					r := Report(bound, stats)
					if r.Exceeds() {
						t.Fatalf("report exceeds its bound: %+v", r)
					}
					// The encoder's own account must match what the decoder produced.
					if r.MaxAbsErr != maxAbs {
						t.Fatalf("reported max-abs %g, measured %g", r.MaxAbsErr, maxAbs)
					}
					if math.Abs(r.RelL2Err-relL2) > 1e-9+1e-6*relL2 {
						t.Fatalf("reported rel-L2 %g, measured %g", r.RelL2Err, relL2)
					}
				})
			}
		}
	}
}

// TestFP16Range: values beyond fp16's range are stored losslessly and flagged, never inf.
func TestFP16Range(t *testing.T) {
	v := gen("normal", 1000, 3)
	v[500] = 1e6
	src := toBytes(v, dtype.Float32)
	c := mustNew(t, "fp16", Options{}).(StatsEncoder)
	out, ok, st, err := c.EncodeStats(nil, src, dtype.Float32)
	if err != nil || !ok {
		t.Fatalf("encode: ok=%v err=%v", ok, err)
	}
	if !st.Lossless || out[0] != modeLossless || st.MaxAbs != 0 {
		t.Fatalf("out-of-range block not flagged lossless: %+v mode %d", st, out[0])
	}
	v[500] = 60000 // within range: lossy
	out, _, st, _ = c.EncodeStats(nil, toBytes(v, dtype.Float32), dtype.Float32)
	if st.Lossless || out[0] != modeLossy {
		t.Fatalf("in-range block stored lossless: %+v", st)
	}
}

// TestQuantRatio guards the compression a rel 1e-3 bound gets on N(0,1) (the worst case):
// the design target is ≥ 3× versus fp32.
func TestQuantRatio(t *testing.T) {
	src := toBytes(gen("normal", 1<<18, 11), dtype.Float32)
	c := mustNew(t, "quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}})
	blocks, stats := encodeTensor(t, c, src, dtype.Float32, 1<<20)
	stored := 0
	for _, b := range blocks {
		stored += len(b)
	}
	r := Report(LossyBound{Mode: "rel", Value: 1e-3}, stats)
	ratio := float64(len(src)) / float64(stored)
	t.Logf("N(0,1) fp32 rel 1e-3: ratio %.3f, rel-L2 %.3g, max-abs %.3g", ratio, r.RelL2Err, r.MaxAbsErr)
	if ratio < 3 || r.RelL2Err > 1e-3 || r.LosslessBlocks != 0 {
		t.Fatalf("ratio %.3f, report %+v", ratio, r)
	}
}

// TestLossyBoundProperty: over many random distributions, scales, shapes, block sizes and
// bounds, the achieved error never exceeds the bound.
func TestLossyBoundProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 42))
	dts := []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16}
	iters := 300
	if testing.Short() {
		iters = 60
	}
	for it := range iters {
		dt := dts[r.IntN(len(dts))]
		kind := kinds[r.IntN(len(kinds))]
		n := 1 + r.IntN(6000)
		scale := math.Pow(10, r.Float64()*12-6)
		v := gen(kind, n, r.Uint64())
		for i := range v {
			v[i] *= scale
		}
		var b LossyBound
		name := "quant"
		switch r.IntN(3) {
		case 0:
			b = LossyBound{Mode: "abs", Value: scale * math.Pow(10, r.Float64()*6-6)}
		case 1:
			b = LossyBound{Mode: "rel", Value: math.Pow(10, r.Float64()*4-5)}
		default:
			name, b = "fp16", LossyBound{Mode: "fp16", Value: math.Pow(10, r.Float64()*3-4)}
		}
		bs := dt.Size() * (1 + r.IntN(3000))
		t.Run(fmt.Sprintf("%d/%s/%s/%s%g", it, dt, kind, b.Mode, b.Value), func(t *testing.T) {
			c := mustNew(t, name, Options{Lossy: &b})
			tensor := toBytes(v, dt)
			blocks, stats := encodeTensor(t, c, tensor, dt, bs)
			got := decodeTensor(t, c, blocks, tensor, dt, bs)
			maxAbs, relL2 := measure(t, tensor, got, dt)
			checkBound(t, &b, maxAbs, relL2)
			if rep := Report(b, stats); rep.Exceeds() || rep.MaxAbsErr != maxAbs {
				t.Fatalf("report %+v, measured max-abs %g rel-L2 %g", rep, maxAbs, relL2)
			}
		})
	}
}

func TestActivationOptions(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want error
	}{
		{"shuffle", Options{Lossy: &LossyBound{Mode: "abs", Value: 1}}, ErrLossyOption},
		{"shuffle", Options{Level: 9}, ErrBadLevel},
		{"quant", Options{Lossy: &LossyBound{Mode: "abs", Value: 0}}, ErrBadBound},
		{"quant", Options{Lossy: &LossyBound{Mode: "rel", Value: math.Inf(1)}}, ErrBadBound},
		{"quant", Options{Lossy: &LossyBound{Mode: "fp16"}}, ErrBadBound},
		{"fp16", Options{Lossy: &LossyBound{Mode: "abs", Value: 1}}, ErrBadBound},
		{"quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}}, nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%+v", tt.name, tt.o), func(t *testing.T) {
			_, err := New(tt.name, tt.o)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	// A decode-only quant (ByID) refuses to encode rather than guess a bound.
	c, err := ByID(Quant)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Encode(nil, make([]byte, 8), dtype.Float32); !errors.Is(err, ErrBadBound) {
		t.Fatalf("decode-only quant encoded: %v", err)
	}
}

func TestFloatConversions(t *testing.T) {
	// Every fp16 value survives f16 → f32 → f16, and rounding is to nearest even.
	for h := range 1 << 16 {
		f := dtype.Float16ToFloat32(uint16(h))
		if f != f { // NaN
			continue
		}
		if got := dtype.Float32ToFloat16(f); got != uint16(h) {
			t.Fatalf("fp16 %#04x → %g → %#04x", h, f, got)
		}
	}
	tests := []struct {
		in   float32
		want uint16
	}{
		{1 + 1.0/2048, 0x3c00},                // tie → even
		{1 + 3.0/2048, 0x3c02},                // tie → even (up)
		{65504, 0x7bff},                       // max
		{65520, 0x7c00},                       // rounds to inf
		{5.960464477539063e-08, 0x0001},       // smallest subnormal
		{2.9802322387695312e-08, 0x0000},      // half of it: tie → 0
		{2.9802322387695312e-08 * 1.01, 0x01}, // above half → 1
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			if got := dtype.Float32ToFloat16(tt.in); got != tt.want {
				t.Fatalf("dtype.Float32ToFloat16(%g) = %#04x, want %#04x", tt.in, got, tt.want)
			}
		})
	}
	if got := dtype.Float32ToBFloat16(1 + 1.0/256); got != 0x3f80 {
		t.Fatalf("bf16 tie: %#04x", got)
	}
}

// --- golden vectors shared with the Python decoder ----------------------------------------

type goldenCase struct {
	Name    string  `json:"name"`
	Codec   string  `json:"codec"`
	CodecID int     `json:"codec_id"`
	Level   int     `json:"level"`
	Mode    string  `json:"mode,omitempty"`
	Bound   float64 `json:"bound,omitempty"`
	Dtype   string  `json:"dtype"`
	Kind    string  `json:"kind"`
	N       int     `json:"n"`
	RawLen  int     `json:"raw_len"`
	// RowLen and Skip (fp8): the tensor's last dimension and where the block starts in a row.
	RowLen int `json:"row_len,omitempty"`
	Skip   int `json:"skip,omitempty"`
}

func goldenCases() []goldenCase {
	var cs []goldenCase
	add := func(codec string, level int, mode string, bound float64, dt dtype.DType, kind string, n int) {
		name := fmt.Sprintf("%s%d_%s_%s_%d", codec, level, dt, kind, n)
		if mode != "" {
			name = fmt.Sprintf("%s%d-%s%g_%s_%s_%d", codec, level, mode, bound, dt, kind, n)
		}
		cs = append(cs, goldenCase{Name: name, Codec: codec, Level: level, Mode: mode, Bound: bound,
			Dtype: dt.String(), Kind: kind, N: n, RawLen: n * dt.Size()})
	}
	for _, dt := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16, dtype.Float64, dtype.Int32, dtype.Uint8} {
		add("shuffle", 0, "", 0, dt, "relu", 2000)
	}
	add("shuffle", 0, "", 0, dtype.Float32, "special", 1001)
	add("shuffle", 0, "", 0, dtype.Float32, "zero", 3000)
	add("shuffle", 0, "", 0, dtype.Int8, "relu", 140000) // a plane over one zstd block
	add("shuffle", 3, "", 0, dtype.Float32, "heavy", 2000)
	for _, dt := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16, dtype.Float64} {
		add("quant", 0, "rel", 1e-3, dt, "relu", 2000)
		add("quant", 0, "abs", 1e-2, dt, "special", 1000)
	}
	add("quant", 0, "abs", 1e-3, dtype.Float32, "outlier", 2048)
	add("quant", 0, "rel", 1e-3, dtype.Float32, "zero", 100)
	add("quant", 3, "rel", 1e-2, dtype.Float32, "heavy", 2000)
	add("fp16", 0, "", 0, dtype.Float32, "normal", 2000)
	add("fp16", 0, "", 0, dtype.Float64, "tiny", 1000)
	add("fp16", 0, "", 0, dtype.Float32, "outlier", 1000) // out of range: lossless
	add("fp16", 0, "", 0, dtype.BFloat16, "normal", 500)  // not downcast: lossless
	rows := func(rowLen, skip int) { cs[len(cs)-1].RowLen, cs[len(cs)-1].Skip = rowLen, skip }
	for _, dt := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
		add("fp8", 0, "", 0, dt, "heavy", 1000)
		rows(96, 40) // first part 56 values, then 9 rows, then a part of 8
		cs[len(cs)-1].Name += "_rows96"
	}
	add("fp8", 0, "", 0, dtype.Float32, "tiny", 512)
	rows(64, 0)
	add("fp8", 0, "", 0, dtype.Float32, "zero", 100)
	rows(10, 0)
	add("fp8", 0, "", 0, dtype.Float32, "special", 64) // NaN/inf: lossless
	rows(16, 0)
	return cs
}

func TestActivationGolden(t *testing.T) {
	manifest := filepath.Join(goldenDir, "manifest.json")
	cs := goldenCases()
	if *updateActivation {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range cs {
			gc := &cs[i]
			o := Options{Level: gc.Level}
			if gc.Mode != "" {
				o.Lossy = &LossyBound{Mode: gc.Mode, Value: gc.Bound}
			}
			c := mustNew(t, gc.Codec, o)
			gc.CodecID = int(c.ID())
			dt, _ := dtype.Parse(gc.Dtype)
			src := toBytes(gen(gc.Kind, gc.N, 99), dt)
			if rp, ok := c.(RowPreparer); ok && gc.RowLen > 0 {
				c, _ = rp.ForRows(src, dt, gc.RowLen, gc.Skip)
			} else if tp, ok := c.(TensorPreparer); ok {
				c, _ = tp.ForTensor(src, dt)
			}
			out, ok, err := c.Encode(nil, src, dt)
			if err != nil || !ok {
				t.Fatalf("%s: encode ok=%v err=%v", gc.Name, ok, err)
			}
			raw, err := c.Decode(nil, out, dt, len(src))
			if err != nil {
				t.Fatalf("%s: %v", gc.Name, err)
			}
			write(t, filepath.Join(goldenDir, gc.Name+".stored"), out)
			write(t, filepath.Join(goldenDir, gc.Name+".raw"), raw)
		}
		j, _ := json.MarshalIndent(cs, "", "  ")
		write(t, manifest, append(j, '\n'))
	}
	j, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatalf("read manifest (run with -update-activation to create): %v", err)
	}
	var got []goldenCase
	if err := json.Unmarshal(j, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cs) {
		t.Fatalf("manifest has %d cases, code %d: run with -update-activation", len(got), len(cs))
	}
	for _, gc := range got {
		t.Run(gc.Name, func(t *testing.T) {
			stored := read(t, filepath.Join(goldenDir, gc.Name+".stored"))
			raw := read(t, filepath.Join(goldenDir, gc.Name+".raw"))
			c, err := ByID(ID(gc.CodecID))
			if err != nil {
				t.Fatal(err)
			}
			dt, err := dtype.Parse(gc.Dtype)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := c.Decode(nil, stored, dt, gc.RawLen)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dec, raw) {
				t.Fatal("decoded bytes differ from the golden raw file")
			}
			// The golden raw of a lossy case still meets its bound against the source.
			if gc.Mode != "" {
				src := toBytes(gen(gc.Kind, gc.N, 99), dt)
				maxAbs, relL2 := measure(t, src, dec, dt)
				checkBound(t, &LossyBound{Mode: gc.Mode, Value: gc.Bound}, maxAbs, relL2)
			}
		})
	}
}

func write(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// --- fuzz --------------------------------------------------------------------------------

// FuzzActivationDecode: any stored bytes decode to exactly rawLen bytes or give an error;
// never a panic or a hang. Seeds are the golden vectors.
func FuzzActivationDecode(f *testing.F) {
	if j, err := os.ReadFile(filepath.Join(goldenDir, "manifest.json")); err == nil {
		var cs []goldenCase
		_ = json.Unmarshal(j, &cs)
		for _, gc := range cs {
			if gc.RawLen > 1<<16 {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(goldenDir, gc.Name+".stored")); err == nil {
				dt, _ := dtype.Parse(gc.Dtype)
				f.Add(b, uint8(gc.CodecID), uint8(dt), uint16(gc.RawLen))
			}
		}
	}
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 1, 0, 0, 0, 0}, uint8(Quant), uint8(dtype.Float32), uint16(4))
	f.Add([]byte{1}, uint8(FP16), uint8(dtype.Float32), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, id, dt uint8, rawLen uint16) {
		c, err := ByID(ID(16 + id%3))
		if err != nil {
			t.Fatal(err)
		}
		prefix := []byte("keep")
		out, err := c.Decode(prefix, data, dtype.DType(dt%13), int(rawLen))
		if err != nil {
			return
		}
		if len(out) != len(prefix)+int(rawLen) || !bytes.Equal(out[:4], prefix) {
			t.Fatalf("decoded %d bytes for raw length %d", len(out)-len(prefix), rawLen)
		}
	})
}

// FuzzActivationRoundTrip: arbitrary bytes read as float32/bf16 survive every codec within
// its bound (lossless ones bit for bit).
func FuzzActivationRoundTrip(f *testing.F) {
	f.Add(toBytes(gen("special", 64, 1), dtype.Float32), uint8(0))
	f.Add(toBytes(gen("outlier", 256, 1), dtype.Float32), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, sel uint8) {
		cs := lossyCodecs()
		dt := dtype.Float32
		if sel&0x80 != 0 {
			dt = dtype.BFloat16
		}
		data = data[:len(data)/dt.Size()*dt.Size()]
		var c Codec
		var b *LossyBound
		if k := int(sel&0x7f) % (len(cs) + 1); k == len(cs) {
			c = mustNew(t, "shuffle", Options{})
		} else {
			c, b = mustNew(t, cs[k].name, cs[k].o), cs[k].o.Lossy
		}
		blocks, _ := encodeTensor(t, c, data, dt, 1024)
		got := decodeTensor(t, c, blocks, data, dt, 1024)
		if b == nil && c.ID() == Shuffle && !bytes.Equal(got, data) {
			t.Fatal("lossless round trip changed bytes")
		}
		maxAbs, relL2 := measure(t, data, got, dt)
		checkBound(t, b, maxAbs, relL2)
	})
}

// --- benchmarks --------------------------------------------------------------------------

func BenchmarkActivation(b *testing.B) {
	src := toBytes(gen("relu", 1<<18, 5), dtype.Float32) // 1 MiB
	cases := []struct {
		name string
		o    Options
	}{
		{"shuffle", Options{}},
		{"quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}}},
		{"fp16", Options{}},
	}
	for _, cc := range cases {
		c := mustNew(b, cc.name, cc.o)
		stored, _, err := c.Encode(nil, src, dtype.Float32)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(cc.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := make([]byte, 0, len(src)+1024)
			for b.Loop() {
				out, ok, err := c.Encode(dst[:0], src, dtype.Float32)
				if err != nil || !ok || len(out) != len(stored) {
					b.Fatalf("encode: %d bytes ok=%v err=%v", len(out), ok, err)
				}
			}
		})
		b.Run(cc.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			dst := make([]byte, 0, len(src))
			for b.Loop() {
				out, err := c.Decode(dst[:0], stored, dtype.Float32, len(src))
				if err != nil || len(out) != len(src) {
					b.Fatalf("decode: %v", err)
				}
			}
		})
	}
}

// TestRealActivations guards ratio and bound on a committed sample of real activations
// (all-MiniLM-L6-v2 layer 0: 110592 attention-output values, then 131072 GELU values;
// written by bench/compression/gen_corpus.py). The full table is in docs/COMPRESSION.md.
func TestRealActivations(t *testing.T) {
	raw := read(t, "testdata/activation/minilm_sample.f32")
	parts := map[string][]byte{"attention": raw[:4*110592], "gelu": raw[4*110592:]}
	tests := []struct {
		name     string
		codec    string
		o        Options
		minRatio float64
	}{
		{"shuffle", "shuffle", Options{}, 1.18},
		{"fp16", "fp16", Options{}, 2.3},
		{"quant-rel1e-3", "quant", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}}, 3.2},
		{"quant-abs1e-3", "quant", Options{Lossy: &LossyBound{Mode: "abs", Value: 1e-3}}, 3.0},
	}
	for _, tt := range tests {
		for pname, src := range parts {
			t.Run(tt.name+"/"+pname, func(t *testing.T) {
				c := mustNew(t, tt.codec, tt.o)
				blocks, stats := encodeTensor(t, c, src, dtype.Float32, 1<<18)
				got := decodeTensor(t, c, blocks, src, dtype.Float32, 1<<18)
				stored := 0
				for i, b := range blocks {
					if b == nil {
						b = src[i<<18 : min((i+1)<<18, len(src))]
					}
					stored += len(b)
				}
				ratio := float64(len(src)) / float64(stored)
				maxAbs, relL2 := measure(t, src, got, dtype.Float32)
				t.Logf("ratio %.3f, max-abs %.3g, rel-L2 %.3g", ratio, maxAbs, relL2)
				checkBound(t, tt.o.Lossy, maxAbs, relL2)
				if lc, ok := c.(LossyCodec); ok && Report(lc.Bound(), stats).Exceeds() {
					t.Fatal("report exceeds bound")
				}
				if tt.o.Lossy == nil && tt.codec == "shuffle" && !bytes.Equal(got, src) {
					t.Fatal("lossless round trip changed bytes")
				}
				if ratio < tt.minRatio {
					t.Fatalf("ratio %.3f < %.2f", ratio, tt.minRatio)
				}
			})
		}
	}
}

// TestShuffleZeroMap: a zero map is written exactly when enough elements are zero, and it
// round-trips -0.0 (not all-zero bytes) as a value.
func TestShuffleZeroMap(t *testing.T) {
	c := mustNew(t, "shuffle", Options{})
	tests := []struct {
		kind string
		n    int
		want byte
	}{
		{"relu", 4000, flagZeroMap},
		{"zero", 4000, flagZeroMap},
		{"normal", 4000, 0},
		{"relu", 100, flagZeroMap},
		{"special", 4000, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.kind, tt.n), func(t *testing.T) {
			src := toBytes(gen(tt.kind, tt.n, 5), dtype.Float32)
			if tt.kind == "relu" {
				storeFloat(src, dtype.Float32, 1, math.Copysign(0, -1))
			}
			out, ok, err := c.Encode(nil, src, dtype.Float32)
			if err != nil || !ok {
				t.Fatalf("encode: ok=%v err=%v", ok, err)
			}
			if out[0] != tt.want {
				t.Fatalf("flags %#x, want %#x", out[0], tt.want)
			}
			got, err := c.Decode(nil, out, dtype.Float32, len(src))
			if err != nil || !bytes.Equal(got, src) {
				t.Fatalf("round trip: %v", err)
			}
		})
	}
}
