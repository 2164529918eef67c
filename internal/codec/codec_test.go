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

// normalF32 is deterministic N(0,1) float32 data with a share of exact zeros, the shape of
// post-activation tensors.
func normalF32(n int, zeroFrac float64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, 4*n)
	for i := range n {
		v := float32(r.NormFloat64())
		if r.Float64() < zeroFrac {
			v = 0
		}
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func allCodecs(t testing.TB) []Codec {
	t.Helper()
	var out []Codec
	for _, name := range []string{"none", "lz4", "zstd"} {
		c, err := New(name, Options{})
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		out = append(out, c)
	}
	return out
}

func TestRegistry(t *testing.T) {
	tests := []struct {
		name string
		id   ID
	}{{"none", None}, {"lz4", LZ4}, {"zstd", Zstd}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if c.ID() != tt.id || c.Name() != tt.name {
				t.Fatalf("got %d %q", c.ID(), c.Name())
			}
			c2, err := ByID(tt.id)
			if err != nil || c2.Name() != tt.name {
				t.Fatalf("ByID(%d) = %v, %v", tt.id, c2, err)
			}
		})
	}
	if _, err := New("brotli", Options{}); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := ByID(99); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want error
	}{
		{"none", Options{Level: 1}, ErrBadLevel},
		{"none", Options{Lossy: &LossyBound{Mode: "abs", Value: 1e-3}}, ErrLossyOption},
		{"lz4", Options{Level: 10}, ErrBadLevel},
		{"lz4", Options{Level: -1}, ErrBadLevel},
		{"lz4", Options{Level: 9}, nil},
		{"lz4", Options{Lossy: &LossyBound{Mode: "fp16"}}, ErrLossyOption},
		{"zstd", Options{Level: 5}, ErrBadLevel},
		{"zstd", Options{Level: 4}, nil},
		{"zstd", Options{Lossy: &LossyBound{Mode: "rel", Value: 1e-3}}, ErrLossyOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.name, tt.opts)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("New(%q, %+v) = %v, want %v", tt.name, tt.opts, err, tt.want)
			}
		})
	}
}

func TestBlockRoundTrip(t *testing.T) {
	inputs := []struct {
		name string
		dt   dtype.DType
		data []byte
	}{
		{"empty", dtype.Float32, nil},
		{"one_byte", dtype.Uint8, []byte{42}},
		{"all_zero", dtype.Float32, make([]byte, 1<<16)},
		{"small_zero", dtype.Float32, make([]byte, 100)}, // zstd omits the content size of small frames unless single-segment
		{"incompressible", dtype.Uint8, randomBytes(1<<16, 1)},
		{"normal_f32", dtype.Float32, normalF32(1<<14, 0.25, 2)},
		{"f16_like", dtype.Float16, randomBytes(1<<12, 3)[:4094]},
		{"i64_small", dtype.Int64, bytes.Repeat([]byte{1, 0, 0, 0, 0, 0, 0, 0}, 1000)},
	}
	for _, c := range allCodecs(t) {
		for _, in := range inputs {
			t.Run(c.Name()+"/"+in.name, func(t *testing.T) {
				prefix := []byte("pfx")
				out, ok, err := c.Encode(append([]byte(nil), prefix...), in.data, in.dt)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasPrefix(out, prefix) {
					t.Fatal("Encode lost dst prefix")
				}
				stored := out[len(prefix):]
				if !ok {
					if len(stored) != 0 {
						t.Fatalf("not compressed but appended %d bytes", len(stored))
					}
					stored = in.data
				} else if c.ID() != None && len(stored) >= len(in.data) {
					t.Fatalf("compressed=true but %d >= %d", len(stored), len(in.data))
				}
				if ok {
					got, err := c.Decode([]byte("x"), stored, in.dt, len(in.data))
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got[1:], in.data) || got[0] != 'x' {
						t.Fatal("round trip mismatch")
					}
					if _, err := c.Decode(nil, stored, in.dt, len(in.data)+1); err == nil {
						t.Fatal("wrong rawLen accepted")
					}
				}
				if in.name == "all_zero" && c.ID() != None && !ok {
					t.Fatal("all-zero block did not compress")
				}
				if in.name == "incompressible" && ok && c.ID() != None {
					t.Fatal("random bytes reported compressed")
				}
			})
		}
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	sizes := []struct {
		name      string
		n         int
		blockSize int
	}{
		{"empty", 0, 1024},
		{"one_byte", 1, 1024},
		{"exact_blocks", 4096, 1024},
		{"ragged", 4097, 1024},
		{"one_block", 1000, 1 << 20},
		{"parallel", 6 << 20, 1 << 20},
	}
	for _, c := range allCodecs(t) {
		for _, s := range sizes {
			t.Run(c.Name()+"/"+s.name, func(t *testing.T) {
				raw := normalF32(s.n/4+1, 0.25, uint64(s.n))[:s.n]
				// Make one block incompressible to exercise the raw bit.
				if s.n > 2*s.blockSize {
					copy(raw[s.blockSize:], randomBytes(s.blockSize, 9))
				}
				bs := s.blockSize
				if c.ID() == None {
					bs = 0
				}
				payload, err := EncodePayload(c, dtype.Float32, raw, max(bs, 1))
				if err != nil {
					t.Fatal(err)
				}
				got, err := DecodePayload(c, dtype.Float32, payload, len(raw), bs)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, raw) {
					t.Fatal("payload round trip mismatch")
				}
				if c.ID() != None && s.n > 2*s.blockSize {
					entries, err := ParseBlockTable(payload, len(raw), bs)
					if err != nil {
						t.Fatal(err)
					}
					if !entries[1].Raw {
						t.Fatal("random block not stored raw")
					}
				}
			})
		}
	}
}

func TestParseBlockTableErrors(t *testing.T) {
	good, err := AppendBlockTable(nil, []int{3, 2}, []bool{false, true})
	if err != nil {
		t.Fatal(err)
	}
	good = append(good, 'a', 'b', 'c', 'd', 'e')
	tests := []struct {
		name      string
		payload   []byte
		rawLen    int
		blockSize int
	}{
		{"short", []byte{1, 0}, 10, 8},
		{"count_mismatch", good, 30, 8},
		{"bad_block_size", good, 10, 0},
		{"huge_block_size", good, 10, MaxBlockSize + 1},
		{"trailing_bytes", append(append([]byte(nil), good...), 0), 10, 8},
		{"past_end", good[:len(good)-1], 10, 8},
		{"raw_size_mismatch", good, 11, 8},
		{"table_past_end", []byte{0xff, 0xff, 0xff, 0x0f, 1, 0, 0, 0}, 1 << 30, 4},
		{"negative_raw", good, -1, 8},
	}
	if _, err := ParseBlockTable(good, 10, 8); err != nil {
		t.Fatalf("good table: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParseBlockTable(tt.payload, tt.rawLen, tt.blockSize); !errors.Is(err, ErrBlockTable) {
				t.Fatalf("got %v, want ErrBlockTable", err)
			}
		})
	}
}

func TestDecodeRejectsLies(t *testing.T) {
	c := allCodecs(t)
	tbl, _ := AppendBlockTable(nil, []int{4}, nil)
	lie := append(tbl, 0x1f, 0, 0, 0) // 4 stored bytes claiming a 64 MiB block
	for _, cc := range c[1:] {
		t.Run(cc.Name(), func(t *testing.T) {
			if _, err := DecodePayload(cc, dtype.Uint8, lie, MaxBlockSize, MaxBlockSize); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
	if _, err := DecodePayload(c[0], dtype.Uint8, []byte{1, 2}, 3, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("none length mismatch: %v", err)
	}
}

func TestAppendBlockTableErrors(t *testing.T) {
	if _, err := AppendBlockTable(nil, []int{1}, []bool{true, false}); !errors.Is(err, ErrBlockTable) {
		t.Fatal(err)
	}
	// Not a constant: on 32-bit targets RawBit does not fit an int and wraps negative,
	// which must be refused all the same.
	big := int64(RawBit)
	if _, err := AppendBlockTable(nil, []int{int(big)}, nil); !errors.Is(err, ErrBlockTable) {
		t.Fatal(err)
	}
}
