package stream

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

// f32Bytes encodes float32 values little-endian.
func f32Bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// normalF32 is deterministic N(0,1) float32 data with a share of zeros.
func normalF32(n int, zeroFrac float64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	v := make([]float32, n)
	for i := range v {
		if r.Float64() >= zeroFrac {
			v[i] = float32(r.NormFloat64())
		}
	}
	return f32Bytes(v...)
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// halfToFloat converts IEEE binary16 bits exactly.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 31:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}

// floatToHalf converts exactly representable values (tests only use such).
func floatToHalf(f float64) uint16 {
	for h := 0; h < 1<<16; h++ {
		if halfToFloat(uint16(h)) == f && !(f == 0 && h != 0) {
			return uint16(h)
		}
	}
	panic("not representable in float16")
}

// values decodes up to n elements of data as numbers, the way the golden JSON lists them.
func values(dt dtype.DType, data []byte, n int) []any {
	var out []any
	le := binary.LittleEndian
	sz := dt.Size()
	for i := 0; i < n && (i+1)*sz <= len(data); i++ {
		e := data[i*sz:]
		switch dt {
		case dtype.Float32:
			out = append(out, float64(math.Float32frombits(le.Uint32(e))))
		case dtype.Float64:
			out = append(out, math.Float64frombits(le.Uint64(e)))
		case dtype.Float16:
			out = append(out, halfToFloat(le.Uint16(e)))
		case dtype.BFloat16:
			out = append(out, float64(math.Float32frombits(uint32(le.Uint16(e))<<16)))
		case dtype.Int8:
			out = append(out, int64(int8(e[0])))
		case dtype.Uint8, dtype.Bool:
			out = append(out, int64(e[0]))
		case dtype.Int16:
			out = append(out, int64(int16(le.Uint16(e))))
		case dtype.Int32:
			out = append(out, int64(int32(le.Uint32(e))))
		case dtype.Int64:
			out = append(out, int64(le.Uint64(e)))
		default:
			return out
		}
	}
	return out
}

// blocksFor cuts raw into what the pipeline would hand the Writer for codec c.
func blocksFor(t testing.TB, c codec.Codec, dt dtype.DType, raw []byte, blockSize int) []Block {
	t.Helper()
	if c.ID() == codec.None {
		return []Block{{Data: raw}}
	}
	var out []Block
	for off := 0; off < len(raw); off += blockSize {
		blk := raw[off:min(len(raw), off+blockSize)]
		enc, ok, err := c.Encode(nil, blk, dt)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, Block{Data: enc})
		} else {
			out = append(out, Block{Data: blk, Raw: true})
		}
	}
	return out
}

func tempFile(t testing.TB) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "s.strap"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func mustCodec(t testing.TB, name string) codec.Codec {
	t.Helper()
	c, err := codec.New(name, codec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
