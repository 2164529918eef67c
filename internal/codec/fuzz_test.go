package codec

import (
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// fuzzDecode feeds arbitrary bytes to one decoder as a block: it must fail or produce
// exactly rawLen bytes, never panic or hang.
func fuzzDecode(f *testing.F, name string) {
	c, err := New(name, Options{})
	if err != nil {
		f.Fatal(err)
	}
	for _, raw := range [][]byte{{}, {0}, make([]byte, 1000), normalF32(256, 0.25, 1), randomBytes(300, 2)} {
		out, ok, err := c.Encode(nil, raw, dtype.Float32)
		if err != nil {
			f.Fatal(err)
		}
		if ok {
			f.Add(out, uint32(len(raw)))
		}
		f.Add(raw, uint32(len(raw)))
	}
	f.Fuzz(func(t *testing.T, src []byte, rawLen uint32) {
		n := int(rawLen % (1 << 22))
		got, err := c.Decode(nil, src, dtype.Uint8, n)
		if err == nil && len(got) != n {
			t.Fatalf("decoded %d bytes, want %d", len(got), n)
		}
	})
}

func FuzzDecodeLZ4(f *testing.F)  { fuzzDecode(f, "lz4") }
func FuzzDecodeZstd(f *testing.F) { fuzzDecode(f, "zstd") }

// FuzzDecodePayload feeds arbitrary payloads with arbitrary header claims to the block-table
// parser and decoders.
func FuzzDecodePayload(f *testing.F) {
	for _, name := range []string{"lz4", "zstd"} {
		c, _ := New(name, Options{})
		for _, raw := range [][]byte{nil, {1}, normalF32(600, 0.25, 3), randomBytes(700, 4), make([]byte, 3000)} {
			p, err := EncodePayload(c, dtype.Float32, raw, 1024)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(c.ID()), p, uint32(len(raw)), uint32(1024))
		}
	}
	f.Fuzz(func(t *testing.T, id uint8, payload []byte, rawLen, blockSize uint32) {
		c, err := ByID(ID(id % 3))
		if err != nil {
			t.Skip()
		}
		n := int(rawLen % (1 << 24))
		got, err := DecodePayload(c, dtype.Uint8, payload, n, int(blockSize%(MaxBlockSize+2)))
		if err == nil && len(got) != n {
			t.Fatalf("decoded %d bytes, want %d", len(got), n)
		}
	})
}
