package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ring")

const goldenDir = "../../testdata/ring"

// goldenRecords are the inputs of the golden record files; testdata/ring/README.md
// describes the same inputs for the Python encoder.
func goldenRecords() map[string]struct {
	t   Tensor
	seq uint64
} {
	f32 := make([]byte, 24)
	for i := range 6 {
		binary.LittleEndian.PutUint32(f32[4*i:], uint32(0x3f800000+i)) // 1.0, then the next floats up
	}
	bf := []byte{0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40} // bf16 1,2,3,4
	part := make([]byte, 16)
	for i := range part {
		part[i] = byte(i)
	}
	return map[string]struct {
		t   Tensor
		seq uint64
	}{
		"record_f32_2x3.bin": {Tensor{Name: "model.layers.0.mlp", DType: dtype.Float32, Shape: []uint64{2, 3}, Step: 5, Forward: 2, Payload: f32}, 1},
		"record_bf16_meta.bin": {Tensor{Name: "model.layers.3.self_attn", DType: dtype.BFloat16, Shape: []uint64{1, 4}, Step: 0, Forward: 0,
			Meta: []byte(`{"positions":[0,4,8],"dim":1}`), Payload: bf}, 7},
		"record_part.bin": {Tensor{Name: "lm_head", DType: dtype.Uint8, Shape: []uint64{4, 16}, Step: 9, Forward: 3, Flags: FlagPart,
			PartOffset: 32, TensorLen: 64, Payload: part}, 12},
		"record_scalar_i64.bin": {Tensor{Name: "x", DType: dtype.Int64, Shape: []uint64{}, Payload: []byte{42, 0, 0, 0, 0, 0, 0, 0}}, 3},
		"record_fp8_bf16_2x4.bin": {Tensor{Name: "model.layers.1.mlp", DType: dtype.BFloat16, Shape: []uint64{2, 4}, Step: 2, Forward: 1,
			Flags: FlagFP8, TensorLen: 16, Payload: fp8GoldenPayload()}, 4},
	}
}

// fp8GoldenBF16 is the tensor of record_fp8_bf16_2x4.bin: bfloat16 [[1, -2.5, 3.3, 7],
// [0, -0, 0, 0]] (3.3 is bfloat16 0x4053, 3.296875).
var fp8GoldenBF16 = []byte{0x80, 0x3f, 0x20, 0xc0, 0x53, 0x40, 0xe0, 0x40, 0, 0, 0, 0x80, 0, 0, 0, 0}

// fp8GoldenPayload is the FP8 payload of fp8GoldenBF16 in blocks of 1 MiB (524288 bfloat16
// values): the scales, codes and sums of fp8's own encoder (row 1, all zeros, has none).
func fp8GoldenPayload() []byte {
	c, err := codec.New("fp8", codec.Options{})
	if err != nil {
		panic(err)
	}
	rc, err := c.(codec.RowPreparer).ForRows(fp8GoldenBF16, dtype.BFloat16, 4, 0)
	if err != nil {
		panic(err)
	}
	out, ok, st, err := rc.(codec.StatsEncoder).EncodeStats(nil, fp8GoldenBF16, dtype.BFloat16)
	if err != nil || !ok || len(st.Rows) != 2 {
		panic(fmt.Sprintf("fp8 golden: %v %v %d", ok, err, len(st.Rows)))
	}
	le := binary.LittleEndian
	p := le.AppendUint32(nil, 524288)
	p = le.AppendUint32(p, 2)
	p = append(p, make([]byte, 8)...) // status 0, reserved
	p = append(p, out[9:17]...)       // two scales, then already 8-aligned
	for i, r := range st.Rows {
		mx := [2]float64{st.MaxAbs, 0}[i]
		for _, v := range []float64{r.SumSq, r.SumSqErr, r.SumSqDec, mx} {
			p = le.AppendUint64(p, math.Float64bits(v))
		}
	}
	return append(p, out[17:]...)
}

func TestGolden(t *testing.T) {
	check := func(t *testing.T, name string, got []byte) {
		t.Helper()
		path := filepath.Join(goldenDir, name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read golden (run with -update to create): %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: encoding differs from golden file", name)
		}
	}
	for name, g := range goldenRecords() {
		t.Run(name, func(t *testing.T) {
			b := AppendRecord(nil, &g.t, g.seq)
			check(t, name, b)
			r, err := ParseRecord(b, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Seq != g.seq || r.Name != g.t.Name || !bytes.Equal(r.Payload, g.t.Payload) || !bytes.Equal(r.Meta, g.t.Meta) {
				t.Fatalf("round trip: got %+v", r)
			}
		})
	}
	t.Run("header_8256.bin", func(t *testing.T) {
		b := make([]byte, HeaderSize)
		PutHeader(b, 8256)
		check(t, "header_8256.bin", b)
		if ds, err := ParseHeader(b, 8256); err != nil || ds != 4160 {
			t.Fatalf("ParseHeader = %d, %v", ds, err)
		}
	})
	t.Run("pad_128.bin", func(t *testing.T) {
		b := make([]byte, 128)
		PutPad(b, 128)
		check(t, "pad_128.bin", b)
	})
	t.Run("token_seq9.bin", func(t *testing.T) {
		check(t, "token_seq9.bin", AppendToken(nil, 9, 4, -7, 36, "h\u00e9llo"))
	})
}

func validRecord(t *testing.T) []byte {
	t.Helper()
	g := goldenRecords()["record_f32_2x3.bin"]
	return AppendRecord(nil, &g.t, 1)
}

func TestParseRecordErrors(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name    string
		mutate  func(b []byte) []byte
		wantSub string
	}{
		{"short", func(b []byte) []byte { return b[:32] }, "at least 64"},
		{"magic", func(b []byte) []byte { copy(b, "XREC"); return b }, `magic "XREC"`},
		{"kind", func(b []byte) []byte { le.PutUint16(b[4:], 4); return b }, "kind 4"},
		{"len not aligned", func(b []byte) []byte { le.PutUint64(b[16:], 100); return b }, "record_len 100"},
		{"len past window", func(b []byte) []byte { le.PutUint64(b[16:], 1024); return b }, "runs past"},
		{"dtype", func(b []byte) []byte { b[6] = 99; return b }, "unknown dtype 99"},
		{"ndim", func(b []byte) []byte { b[7] = 9; return b }, "ndim 9"},
		{"name empty", func(b []byte) []byte { le.PutUint16(b[56:], 0); return b }, "name_len 0"},
		{"flags", func(b []byte) []byte { le.PutUint16(b[58:], 4); return b }, "flags 0x4"},
		{"meta too long", func(b []byte) []byte { le.PutUint32(b[60:], 70000); return b }, "meta_len 70000"},
		{"payload_off misaligned", func(b []byte) []byte { le.PutUint64(b[40:], 65); return b }, "payload_off 65"},
		{"payload_off inside header", func(b []byte) []byte { le.PutUint32(b[60:], 40); return b }, "payload_off 128"},
		{"payload past record", func(b []byte) []byte { le.PutUint64(b[48:], 1000); return b }, "exceeds record_len"},
		{"shape mismatch", func(b []byte) []byte { le.PutUint64(b[80:], 3); return b }, "shape [3 3]"},
		{"tensor_len != payload_len", func(b []byte) []byte { le.PutUint64(b[48:], 20); return b }, "tensor_len 24 != payload_len 20"},
		{"part_offset without PART", func(b []byte) []byte { le.PutUint64(b[64:], 8); return b }, "part_offset 8"},
		{"part out of range", func(b []byte) []byte { le.PutUint16(b[58:], 1); le.PutUint64(b[64:], 8); return b }, "part_offset 8 + payload_len 24"},
		{"shape overflow", func(b []byte) []byte { le.PutUint64(b[80:], 1<<62); le.PutUint64(b[88:], 1<<3); return b }, "is not tensor_len"},
		// The name starts after the 80-byte header and 2 dims.
		{"name not UTF-8", func(b []byte) []byte { copy(b[96:], "model.\xff\xfe"); return b }, `name "model.\xff\xfe`},
		{"name truncated rune", func(b []byte) []byte { copy(b[96+17:], "\xe2"); return b }, "is not valid UTF-8"},
		{"meta not UTF-8", func(b []byte) []byte {
			g := goldenRecords()["record_bf16_meta.bin"]
			g.t.Meta = []byte("{\"text\":\"\xc0\xaf\"}") // overlong "/": invalid UTF-8
			return AppendRecord(nil, &g.t, 7)
		}, `meta of "model.layers.3.self_attn" is not valid UTF-8`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mutate(validRecord(t))
			_, err := ParseRecord(b, Limits{})
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("err = %v, want ErrBadRecord", err)
			}
			if !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.wantSub)
			}
		})
	}
	t.Run("limits", func(t *testing.T) {
		_, err := ParseRecord(validRecord(t), Limits{MaxNameLen: 4})
		if err == nil || !strings.Contains(err.Error(), "name_len 18, expected 1..4") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("element limit", func(t *testing.T) {
		// validRecord declares 6 elements: a limit of 5 refuses it, 6 accepts it.
		_, err := ParseRecord(validRecord(t), Limits{MaxElements: 5})
		if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "6 elements, at most 5") {
			t.Fatalf("err = %v", err)
		}
		if _, err := ParseRecord(validRecord(t), Limits{MaxElements: 6}); err != nil {
			t.Fatalf("at the limit: %v", err)
		}
	})
}

func TestParseHeaderErrors(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name    string
		mutate  func(b []byte)
		size    uint64
		wantSub string
	}{
		{"ok", func([]byte) {}, 8192, ""},
		{"magic", func(b []byte) { b[0] = 'X' }, 8192, "magic"},
		{"version", func(b []byte) { le.PutUint32(b[4:], 2) }, 8192, "version 2"},
		{"size mismatch", func([]byte) {}, 8256, "ring_size 8192, expected 8256"},
		{"data_offset", func(b []byte) { le.PutUint64(b[16:], 64) }, 8192, "data_offset 64"},
		{"data_size", func(b []byte) { le.PutUint64(b[24:], 64) }, 8192, "data_size 64"},
		{"reserved", func(b []byte) { b[100] = 1 }, 8192, "reserved byte 100"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, HeaderSize)
			PutHeader(b, 8192)
			tc.mutate(b)
			_, err := ParseHeader(b, tc.size)
			if tc.wantSub == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrRingHeader) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want ErrRingHeader containing %q", err, tc.wantSub)
			}
		})
	}
}

func TestMapChecks(t *testing.T) {
	t.Run("sealed ok", func(t *testing.T) {
		p, err := NewProducer(HeaderSize+4096, ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		r, err := Map(int(p.File().Fd()), HeaderSize+4096)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.DataSize() != 4096 || r.Size() != HeaderSize+4096 {
			t.Fatalf("sizes %d %d", r.DataSize(), r.Size())
		}
	})
	t.Run("unsealed", func(t *testing.T) {
		p, err := NewProducer(HeaderSize+4096, ProducerOptions{NoSeal: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := Map(int(p.File().Fd()), HeaderSize+4096); !errors.Is(err, ErrNotSealed) {
			t.Fatalf("err = %v, want ErrNotSealed", err)
		}
	})
	t.Run("size mismatch", func(t *testing.T) {
		p, err := NewProducer(HeaderSize+4096, ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := Map(int(p.File().Fd()), HeaderSize+8192); !errors.Is(err, ErrRingSize) {
			t.Fatalf("err = %v, want ErrRingSize", err)
		}
	})
	t.Run("regular file", func(t *testing.T) {
		f, err := os.CreateTemp(t.TempDir(), "ring")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(HeaderSize + 4096); err != nil {
			t.Fatal(err)
		}
		if _, err := Map(int(f.Fd()), HeaderSize+4096); !errors.Is(err, ErrNotMemfd) {
			t.Fatalf("err = %v, want ErrNotMemfd", err)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		var fds [2]int
		if err := unix.Pipe(fds[:]); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		if _, err := Map(fds[0], HeaderSize+4096); !errors.Is(err, ErrNotMemfd) {
			t.Fatalf("err = %v, want ErrNotMemfd", err)
		}
	})
}

func TestProducerReaderRoundTrip(t *testing.T) {
	const ringSize = HeaderSize + 1024
	p, err := NewProducer(ringSize, ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ring, err := Map(int(p.File().Fd()), ringSize)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	rd := NewReader(ring.Data(), 0, Limits{})
	// 300 payload bytes: record is 128+320 = 448, two fit per 1024 with a pad after.
	payload := bytes.Repeat([]byte{7}, 300)
	var wantSeq uint64 = 1
	pads := 0
	for i := range 10 {
		tn := Tensor{Name: "m", DType: dtype.Uint8, Shape: []uint64{300}, Step: uint64(i), Payload: payload}
		seq, err := p.Put(&tn)
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if seq != wantSeq {
			t.Fatalf("seq %d, want %d", seq, wantSeq)
		}
		for rd.Pos() < p.Head() {
			rec, _, err := rd.Next(p.Head())
			if err != nil {
				t.Fatal(err)
			}
			if rec.Kind == KindPad {
				pads++
				continue
			}
			if rec.Seq != wantSeq || rec.Step != uint64(i) || !bytes.Equal(rec.Payload, payload) {
				t.Fatalf("record %d: seq %d step %d", i, rec.Seq, rec.Step)
			}
		}
		wantSeq++
		if err := p.Release(rd.Pos()); err != nil {
			t.Fatal(err)
		}
	}
	if pads == 0 {
		t.Fatal("expected PAD records at the wrap")
	}
	// Ring full: nothing released.
	big := Tensor{Name: "m", DType: dtype.Uint8, Shape: []uint64{300}, Payload: payload}
	if _, err := p.Put(&big); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Put(&big); err != nil && !errors.Is(err, ErrRingFull) {
		t.Fatal(err)
	}
	for {
		if _, err := p.Put(&big); errors.Is(err, ErrRingFull) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	huge := Tensor{Name: "m", DType: dtype.Uint8, Shape: []uint64{2000}, Payload: make([]byte, 2000)}
	if _, err := p.Put(&huge); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	parts := p.Split(&huge)
	var covered uint64
	for _, pt := range parts {
		if pt.Flags&FlagPart == 0 || pt.PartOffset != covered || pt.TensorLen != 2000 || pt.RecordLen() > p.DataSize() {
			t.Fatalf("bad part %+v", pt)
		}
		covered += uint64(len(pt.Payload))
	}
	if covered != 2000 || len(parts) < 2 {
		t.Fatalf("parts cover %d in %d parts", covered, len(parts))
	}
}

func TestReaderRejectsPadNotAtEnd(t *testing.T) {
	data := make([]byte, 1024)
	PutPad(data, 128)
	if _, _, err := NewReader(data, 0, Limits{}).Next(1024); err == nil || !strings.Contains(err.Error(), "expected the region end 1024") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParseRecord(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*.bin"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	// Invalid UTF-8 in the name and in the meta: the mutator starts next to the boundary.
	for _, tn := range []Tensor{
		{Name: "model.\xff\xfe", DType: dtype.Uint8, Shape: []uint64{2}, Payload: []byte{1, 2}},
		{Name: "m\xed\xa0\x80", DType: dtype.Uint8, Shape: []uint64{1}, Payload: []byte{1}}, // a UTF-16 surrogate
		{Name: "m", DType: dtype.Uint8, Shape: []uint64{1}, Meta: []byte("{\"text\":\"\xf8\x88\"}"), Payload: []byte{1}},
	} {
		f.Add(AppendRecord(nil, &tn, 1))
	}
	f.Add(AppendToken(nil, 7, 3, 42, 35, "hello"))
	f.Add(AppendToken(nil, 7, 3, -1, -1, "\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRecord(b, Limits{})
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error does not wrap ErrBadRecord: %v", err)
			}
			return
		}
		if r.Len > uint64(len(b)) || r.Len%Align != 0 {
			t.Fatalf("accepted record_len %d of %d bytes", r.Len, len(b))
		}
		if !utf8.ValidString(r.Name) || !utf8.Valid(r.Meta) {
			t.Fatalf("accepted a name %q or meta %q that is not UTF-8", r.Name, r.Meta)
		}
		if r.Kind == KindToken {
			if !utf8.Valid(r.Payload) || len(r.Payload) > MaxTokenText || r.Name != "" || r.Meta != nil {
				t.Fatalf("accepted a token with text %q, name %q, meta %q", r.Payload, r.Name, r.Meta)
			}
			r2, err := ParseRecord(AppendToken(nil, r.Seq, r.Step, r.TokenID(), r.Position(), string(r.Payload)), Limits{})
			if err != nil || r2.Seq != r.Seq || r2.Step != r.Step || r2.TokenID() != r.TokenID() ||
				r2.Position() != r.Position() || !bytes.Equal(r2.Payload, r.Payload) {
				t.Fatalf("re-encoded token differs: %+v, %v", r2, err)
			}
		}
		if r.Kind == KindTensor && r.Flags&FlagFP8 != 0 {
			// An FP8 record the parser takes has the layout the block builder needs; its
			// values may still be refused, by an error, never a panic.
			n := r.TensorLen / uint64(r.DType.Size())
			c, err := codec.NewFP8Coded(r.DType, int(n), int(FP8RowLen(r.Shape, n)), int(r.FP8.BlockValues), 0,
				r.FP8.Scales, r.FP8.Sums, r.FP8.Codes)
			if err != nil {
				t.Fatalf("parsed FP8 record refused by the block builder: %v", err)
			}
			for i := range c.Blocks() {
				if out, _, err := c.Block(nil, i); err == nil && len(out) != c.BlockLen(i) {
					t.Fatalf("block %d of %d bytes, BlockLen %d", i, len(out), c.BlockLen(i))
				}
			}
		}
		if r.Kind == KindTensor {
			// Re-encoding what was parsed must parse to the same fields.
			tn := Tensor{Name: r.Name, DType: r.DType, Shape: r.Shape, Step: r.Step, Forward: r.Forward, Meta: r.Meta,
				Flags: r.Flags, PartOffset: r.PartOffset, TensorLen: r.TensorLen, Payload: r.Payload}
			r2, err := ParseRecord(AppendRecord(nil, &tn, r.Seq), Limits{})
			if err != nil {
				t.Fatalf("re-encoded record rejected: %v", err)
			}
			if r2.Seq != r.Seq || r2.Name != r.Name || !bytes.Equal(r2.Payload, r.Payload) || r2.TensorLen != r.TensorLen {
				t.Fatalf("re-encode mismatch")
			}
		}
	})
}

func TestTokenRecord(t *testing.T) {
	b := AppendToken(nil, 9, 4, -7, 36, "héllo")
	if uint64(len(b)) != TokenRecordLen(6) || len(b) != 192 {
		t.Fatalf("len %d", len(b))
	}
	r, err := ParseRecord(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != KindToken || r.Seq != 9 || r.Step != 4 || r.TokenID() != -7 || r.Position() != 36 || string(r.Payload) != "héllo" || r.Len != 192 {
		t.Fatalf("%+v", r)
	}
	for _, tc := range []struct {
		name string
		edit func(b []byte)
		want string
	}{
		{"dtype set", func(b []byte) { b[6] = 1 }, "expected all 0"},
		{"name_len set", func(b []byte) { b[56] = 1 }, "expected all 0"},
		{"tensor_len set", func(b []byte) { b[72] = 1 }, "expected all 0"},
		{"payload past record", func(b []byte) { b[48] = 100 }, "exceeds record_len"},
		{"payload_off unaligned", func(b []byte) { b[40] = 100 }, "payload_off"},
		{"text not UTF-8", func(b []byte) { b[128] = 0xff }, "not valid UTF-8"},
		{"too short", func(b []byte) { b[16] = 64 }, "needs at least 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := append([]byte(nil), b...)
			tc.edit(c)
			if _, err := ParseRecord(c, Limits{}); err == nil || !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestReaderInterns: records of a name seen before share its string and, when equal, its
// shape; a changed shape is read as it is.
func TestReaderInterns(t *testing.T) {
	var data []byte
	mk := func(shape ...uint64) {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		tn := Tensor{Name: "model.layers.0", DType: dtype.Uint8, Shape: shape, Payload: make([]byte, n)}
		data = AppendRecord(data, &tn, uint64(len(data)/64+1))
	}
	mk(2, 3)
	mk(2, 3)
	mk(3, 2)
	mk(3, 2)
	rd := NewReader(data, 0, Limits{})
	var recs []Record
	for rd.Pos() < uint64(len(data)) {
		r, _, err := rd.Next(uint64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if fmt.Sprint(recs[0].Shape, recs[1].Shape, recs[2].Shape, recs[3].Shape) != "[2 3] [2 3] [3 2] [3 2]" {
		t.Fatalf("shapes %v %v %v %v", recs[0].Shape, recs[1].Shape, recs[2].Shape, recs[3].Shape)
	}
	if &recs[0].Shape[0] != &recs[1].Shape[0] || &recs[2].Shape[0] != &recs[3].Shape[0] ||
		unsafe.StringData(recs[0].Name) != unsafe.StringData(recs[3].Name) {
		t.Fatal("a repeated name or shape was allocated again")
	}
	if allocs := testing.AllocsPerRun(100, func() {
		rd := NewReader(data, 0, Limits{})
		for range 4 {
			if _, _, err := rd.Next(uint64(len(data))); err != nil {
				t.Fatal(err)
			}
		}
	}); allocs > 8 { // the reader and its maps, the name once, two shapes
		t.Fatalf("%v allocations for 4 records", allocs)
	}
}

// TestFP8Record: the golden FP8 record parses into its payload's parts, its blocks are the
// ones fp8's encoder writes for the tensor, and each layout error is refused by name.
func TestFP8Record(t *testing.T) {
	g := goldenRecords()["record_fp8_bf16_2x4.bin"]
	b := AppendRecord(nil, &g.t, g.seq)
	r, err := ParseRecord(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f := r.FP8
	if f.BlockValues != 524288 || f.Parts != 2 || f.Status != 0 || len(f.Scales) != 8 || len(f.Sums) != 64 || len(f.Codes) != 8 {
		t.Fatalf("parsed %+v", f)
	}
	c, err := codec.NewFP8Coded(r.DType, 8, 4, int(f.BlockValues), 0, f.Scales, f.Sums, f.Codes)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := c.Block(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := codec.New("fp8", codec.Options{})
	rc, _ := enc.(codec.RowPreparer).ForRows(fp8GoldenBF16, dtype.BFloat16, 4, 0)
	want, _, _ := rc.Encode(nil, fp8GoldenBF16, dtype.BFloat16)
	if !bytes.Equal(got, want) {
		t.Fatalf("block %x, encoder's %x", got, want)
	}
	if FP8Parts(8, 4, 3) != 4 || FP8Parts(8, 4, 524288) != 2 || FP8Parts(10, 10, 4) != 3 || FP8Parts(0, 4, 4) != 0 {
		t.Fatal("FP8Parts")
	}

	le := binary.LittleEndian
	off := le.Uint64(b[40:])
	for _, tc := range []struct {
		name    string
		mutate  func(b []byte) []byte
		wantSub string
	}{
		{"part", func(b []byte) []byte { le.PutUint16(b[58:], FlagFP8|FlagPart); return b }, "expected no PART"},
		{"int dtype", func(b []byte) []byte { b[6] = byte(dtype.Int16); return b }, "FP8 record"},
		{"block values 0", func(b []byte) []byte { le.PutUint32(b[off:], 0); return b }, "block_values 0"},
		{"parts", func(b []byte) []byte { le.PutUint32(b[off+4:], 3); return b }, "says 3 row parts"},
		{"cut elsewhere", func(b []byte) []byte { le.PutUint32(b[off:], 3); return b }, "make 4"},
		{"status bit", func(b []byte) []byte { le.PutUint32(b[off+8:], 8); return b }, "status 0x8"},
		{"reserved", func(b []byte) []byte { b[off+12] = 1; return b }, "reserved 0x1"},
		{"payload short", func(b []byte) []byte { le.PutUint64(b[48:], le.Uint64(b[48:])-1); return b }, "FP8 payload_len"},
		{"header short", func(b []byte) []byte { le.PutUint64(b[48:], 8); return b }, "header needs 16"},
		{"tensor_len", func(b []byte) []byte { le.PutUint64(b[72:], 18); return b }, "tensor_len 18"},
		{"huge shape", func(b []byte) []byte { le.PutUint64(b[80:], 1<<40); le.PutUint64(b[72:], 1<<43); return b }, "cannot hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRecord(tc.mutate(bytes.Clone(b)), Limits{})
			if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want %q", err, tc.wantSub)
			}
		})
	}
}
