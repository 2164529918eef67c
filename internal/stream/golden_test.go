package stream

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

var update = flag.Bool("update", false, "rewrite the golden streams in testdata/stream")

const goldenDir = "../../testdata/stream"

// goldenFile is the JSON description of one golden stream; the schema is documented in
// testdata/stream/README.md, which the Python reader's tests follow too.
type goldenFile struct {
	Stream            string         `json:"stream"`
	Size              int64          `json:"size"`
	HeaderMeta        map[string]any `json:"header_meta"`
	DataOffset        int64          `json:"data_offset"`
	Packets           []goldenPacket `json:"packets"`
	Tensors           []goldenTensor `json:"tensors"`
	IncompleteTensors int            `json:"incomplete_tensors"`
	End               *EndMeta       `json:"end"`
	IndexOffset       *int64         `json:"index_offset"`
	Index             []goldenEntry  `json:"index"`
	TruncatedAt       *int64         `json:"truncated_at"`
}

type goldenPacket struct {
	Offset        int64           `json:"offset"`
	Type          string          `json:"type"`
	Seq           uint64          `json:"seq"`
	Step          uint64          `json:"step"`
	Forward       uint64          `json:"forward"`
	Name          string          `json:"name"`
	DType         *string         `json:"dtype"`
	Shape         []uint64        `json:"shape"`
	Codec         string          `json:"codec"`
	CodecID       uint8           `json:"codec_id"`
	Flags         uint8           `json:"flags"`
	RawLen        uint64          `json:"raw_len"`
	StoredLen     uint64          `json:"stored_len"`
	PartOffset    uint64          `json:"part_offset"`
	TensorLen     uint64          `json:"tensor_len"`
	BlockSize     uint32          `json:"block_size"`
	Meta          json.RawMessage `json:"meta"`
	PayloadSHA256 string          `json:"payload_sha256,omitempty"`
	PayloadHex    *string         `json:"payload_hex,omitempty"`
	FirstValues   []any           `json:"first_values,omitempty"`
}

type goldenTensor struct {
	Name        string   `json:"name"`
	Seq         uint64   `json:"seq"`
	Step        uint64   `json:"step"`
	Forward     uint64   `json:"forward"`
	DType       string   `json:"dtype"`
	Shape       []uint64 `json:"shape"`
	Parts       int      `json:"parts"`
	Bytes       int      `json:"bytes"`
	SHA256      string   `json:"sha256"`
	FirstValues []any    `json:"first_values"`
}

type goldenEntry struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Flags   uint16 `json:"flags"`
	Seq     uint64 `json:"seq"`
	Step    uint64 `json:"step"`
	Forward uint64 `json:"forward"`
	Offset  int64  `json:"offset"`
}

const nFirst = 8

// gpacket is one packet of a scenario with its decoded payload.
type gpacket struct {
	p   Packet
	raw []byte
}

type scenario struct {
	name      string
	codec     string
	blockSize int
	packets   []gpacket
	end       EndInfo
	// cut, when set, truncates the file: packet index and bytes into that packet.
	cutPacket, cutInto int
	cutFrom            string // scenario whose file is cut
}

func tensorPacket(name string, dt dtype.DType, shape []uint64, raw []byte, seq, step, fwd uint64, meta string) gpacket {
	return gpacket{p: Packet{Header: Header{Type: TypeTensor, DType: dt, Shape: shape, Seq: seq, Step: step, Forward: fwd, RawLen: uint64(len(raw))}, Name: name, Meta: []byte(meta)}, raw: raw}
}

// splitParts cuts one tensor into PART packets of partLen bytes, seqs from seq on.
func splitParts(name string, dt dtype.DType, shape []uint64, raw []byte, partLen int, seq, step, fwd uint64) []gpacket {
	var out []gpacket
	for off := 0; off < len(raw); off += partLen {
		part := raw[off:min(len(raw), off+partLen)]
		out = append(out, gpacket{p: Packet{Header: Header{Type: TypeTensor, DType: dt, Shape: shape, Flags: FlagPart, Seq: seq, Step: step, Forward: fwd, RawLen: uint64(len(part)), PartOffset: uint64(off), TensorLen: uint64(len(raw))}, Name: name}, raw: part})
		seq++
	}
	return out
}

func f16Bytes(v ...float64) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], floatToHalf(x))
	}
	return b
}

func bf16Bytes(v ...float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(f32Bits(x)>>16))
	}
	return b
}

func f32Bits(x float32) uint32 { return binary.LittleEndian.Uint32(f32Bytes(x)) }

func i64Bytes(v ...int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

func seqF32(n int, scale, shift float32) []byte {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i)*scale + shift
	}
	return f32Bytes(v...)
}

func scenarios() []scenario {
	basic := []gpacket{
		tensorPacket("model.layers.0.mlp", dtype.Float32, []uint64{2, 3}, seqF32(6, 0.5, -1), 1, 0, 0, ""),
		tensorPacket("model.layers.0.self_attn", dtype.Float16, []uint64{4}, f16Bytes(1, -2.5, 0, 65504), 2, 0, 0, ""),
		tensorPacket("lm_head", dtype.BFloat16, []uint64{2, 2}, bf16Bytes(1, -1, 0.5, 3.140625), 3, 0, 0, ""),
		tensorPacket("input_ids", dtype.Int64, []uint64{3}, i64Bytes(1, -2, 1<<40), 4, 0, 0, ""),
		{p: Packet{Header: Header{Type: TypeToken, Seq: 5, Step: 0}, Meta: []byte(`{"token_id":42,"text":"hi","position":0}`)}},
		tensorPacket("model.layers.1.mlp", dtype.Float32, []uint64{1, 3, 4}, seqF32(12, 0.25, 0), 6, 1, 1,
			`{"positions":[0,4,8],"dim":1}`),
		{p: Packet{Header: Header{Type: TypeDrop, Seq: 7, Step: 1, Forward: 1, RawLen: 4096}, Name: "model.layers.1.mlp", Meta: []byte(`{"reason":"ring_full"}`)}},
	}
	basic = append(basic, splitParts("model.norm", dtype.Float32, []uint64{4, 8}, seqF32(32, 1, -16), 48, 8, 1, 1)...)
	basic = append(basic, tensorPacket("model.layers.1.mask", dtype.Bool, []uint64{5}, []byte{1, 0, 1, 1, 0}, 11, 1, 1, ""))

	mixed := func(seed uint64) []gpacket {
		return append([]gpacket{
			tensorPacket("model.layers.0.mlp", dtype.Float32, []uint64{16, 64}, normalF32(1024, 0.25, seed), 1, 0, 0, ""),
			tensorPacket("model.layers.0.self_attn", dtype.Uint8, []uint64{2048}, randomBytes(2048, seed), 2, 0, 0, ""),
			tensorPacket("model.layers.0.zero", dtype.Float16, []uint64{1000}, make([]byte, 2000), 3, 0, 0, ""),
			tensorPacket("input_ids", dtype.Int64, []uint64{1, 7}, i64Bytes(1, 15043, 29892, 590, 1024, 338, 2), 4, 0, 0, ""),
			{p: Packet{Header: Header{Type: TypeDrop, Seq: 5, Step: 1, Forward: 1, RawLen: 4096}, Name: "model.layers.0.mlp", Meta: []byte(`{"reason":"ring_full"}`)}},
		}, splitParts("lm_head", dtype.Float32, []uint64{8, 256}, normalF32(2048, 0, seed+1), 4096, 6, 1, 1)...)
	}
	return []scenario{
		{name: "none_basic", codec: "none", packets: basic, end: EndInfo{Status: "complete"}},
		{name: "lz4_mixed", codec: "lz4", blockSize: 1024, packets: mixed(10), end: EndInfo{Status: "complete"}},
		{name: "zstd_mixed", codec: "zstd", blockSize: 1024, packets: mixed(20),
			end: EndInfo{Status: "error", Error: "write stream: no space left on device (test)"}},
		{name: "none_truncated", cutFrom: "none_basic", cutPacket: 5, cutInto: 50},
		{name: "none_cut_at_packet", cutFrom: "none_basic", cutPacket: 7},
	}
}

func headerMeta(sc scenario) map[string]any {
	return map[string]any{
		"strapd_version": "0.1.0-golden",
		"created":        "2026-01-01T00:00:00Z",
		"host":           "golden",
		"session":        1,
		"codec":          sc.codec,
		"codec_level":    0,
		"block_size":     sc.blockSize,
		"policy":         "block",
		"client_metadata": map[string]any{
			"model_class":    "GoldenModel",
			"capture_config": map[string]any{"mode": "ALL"},
			"client":         "golden-test",
		},
	}
}

// buildGolden writes scenario sc with the Writer and describes, from the inputs (not by
// reading the file back), what a reader must find in it.
func buildGolden(t *testing.T, sc scenario, built map[string][]byte, descs map[string]goldenFile) ([]byte, goldenFile) {
	t.Helper()
	if sc.cutFrom != "" {
		return cutGolden(t, sc, built[sc.cutFrom], descs[sc.cutFrom])
	}
	c := mustCodec(t, sc.codec)
	f := tempFile(t)
	meta := headerMeta(sc)
	w, err := New(f, meta)
	if err != nil {
		t.Fatal(err)
	}
	g := goldenFile{Stream: sc.name + ".strap", HeaderMeta: roundTripJSON(t, meta), DataOffset: w.Offset()}
	var partial *goldenTensor
	var partialData []byte
	for _, gp := range sc.packets {
		p := gp.p
		if p.Type == TypeTensor {
			p.Codec = c.ID()
			if c.ID() != codec.None {
				p.BlockSize = uint32(sc.blockSize)
			}
			p.Blocks = blocksFor(t, c, p.DType, gp.raw, sc.blockSize)
			if c.ID() == codec.None && len(gp.raw) > 8 {
				// Several slices, as the daemon passes a record that wraps in the ring.
				p.Blocks = []Block{{Data: gp.raw[:5]}, {Data: gp.raw[5:]}}
			}
		}
		off := w.Offset()
		if err := w.WritePacket(&p); err != nil {
			t.Fatalf("%s seq %d: %v", sc.name, p.Seq, err)
		}
		gpk := describe(p, off, w.Offset(), gp.raw)
		g.Packets = append(g.Packets, gpk)
		if p.Type != TypeTensor {
			continue
		}
		if p.Flags&FlagPart == 0 {
			g.Tensors = append(g.Tensors, tensorDesc(p, gp.raw, 1))
			continue
		}
		if p.PartOffset == 0 {
			gt := tensorDesc(p, nil, 0)
			partial, partialData = &gt, nil
		}
		partialData = append(partialData, gp.raw...)
		partial.Parts++
		if uint64(len(partialData)) == p.TensorLen {
			full := tensorDesc(p, partialData, partial.Parts)
			full.Seq = partial.Seq
			g.Tensors = append(g.Tensors, full)
			partial = nil
		}
	}
	endOff := w.Offset()
	if err := w.Close(sc.end); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != w.Offset() {
		t.Fatalf("file has %d bytes, writer says %d", len(data), w.Offset())
	}
	g.Size = int64(len(data))
	em := EndMeta{Status: sc.end.Status, Error: sc.end.Error, Packets: uint64(len(sc.packets))}
	for _, gp := range sc.packets {
		if gp.p.Type == TypeDrop {
			em.Drops++
		}
	}
	g.End = &em
	endMeta, _ := json.Marshal(em)
	g.Packets = append(g.Packets, goldenPacket{Offset: endOff, Type: "END", Shape: []uint64{}, Codec: "none",
		Meta: endMeta})
	idxOff := endOff + PacketHeaderLen + int64(len(endMeta))
	g.IndexOffset = &idxOff
	names := map[string]bool{}
	idxLen := 4 + 8
	for _, gpk := range g.Packets[:len(g.Packets)-1] {
		g.Index = append(g.Index, goldenEntry{Name: gpk.Name, Type: gpk.Type, Flags: uint16(gpk.Flags),
			Seq: gpk.Seq, Step: gpk.Step, Forward: gpk.Forward, Offset: gpk.Offset})
		if !names[gpk.Name] {
			names[gpk.Name] = true
			idxLen += 2 + len(gpk.Name)
		}
		idxLen += IndexEntryLen
	}
	g.Packets = append(g.Packets, goldenPacket{Offset: idxOff, Type: "INDEX", Shape: []uint64{}, Codec: "none",
		RawLen: uint64(idxLen), StoredLen: uint64(idxLen), TensorLen: uint64(idxLen)})
	if want := idxOff + PacketHeaderLen + int64(idxLen) + FooterLen; want != g.Size {
		t.Fatalf("%s: size %d, layout says %d", sc.name, g.Size, want)
	}
	return data, g
}

// cutGolden truncates an earlier scenario's file inside (or at the start of) one packet.
func cutGolden(t *testing.T, sc scenario, data []byte, src goldenFile) ([]byte, goldenFile) {
	t.Helper()
	cut := src.Packets[sc.cutPacket].Offset + int64(sc.cutInto)
	g := goldenFile{Stream: sc.name + ".strap", Size: cut, HeaderMeta: src.HeaderMeta, DataOffset: src.DataOffset}
	g.Packets = src.Packets[:sc.cutPacket]
	if sc.cutInto > 0 {
		g.TruncatedAt = &src.Packets[sc.cutPacket].Offset
	}
	seqs := map[uint64]bool{}
	for _, p := range g.Packets {
		seqs[p.Seq] = true
	}
	for _, tn := range src.Tensors {
		last := tn.Seq + uint64(tn.Parts) - 1
		if seqs[last] {
			g.Tensors = append(g.Tensors, tn)
		} else if seqs[tn.Seq] {
			g.IncompleteTensors++
		}
	}
	return data[:cut], g
}

func describe(p Packet, off, next int64, raw []byte) goldenPacket {
	hl := PacketHeaderLen + 8*len(p.Shape) + len(p.Name) + len(p.Meta)
	g := goldenPacket{Offset: off, Type: p.Type.String(), Seq: p.Seq, Step: p.Step, Forward: p.Forward,
		Name: p.Name, Shape: append([]uint64{}, p.Shape...), Codec: codecName(p.Codec), CodecID: uint8(p.Codec),
		Flags: p.Flags, RawLen: p.RawLen, StoredLen: uint64(next - off - int64(hl)), PartOffset: p.PartOffset,
		TensorLen: p.TensorLen, BlockSize: p.BlockSize}
	if g.TensorLen == 0 && p.Flags&FlagPart == 0 {
		g.TensorLen = p.RawLen
	}
	if p.DType != dtype.Invalid {
		s := p.DType.String()
		g.DType = &s
	}
	if len(p.Meta) > 0 {
		g.Meta = json.RawMessage(p.Meta)
	}
	if p.Type == TypeTensor {
		sum := sha256.Sum256(raw)
		g.PayloadSHA256 = hex.EncodeToString(sum[:])
		if len(raw) <= 64 {
			h := hex.EncodeToString(raw)
			g.PayloadHex = &h
		}
		g.FirstValues = values(p.DType, raw, nFirst)
	}
	return g
}

func tensorDesc(p Packet, data []byte, parts int) goldenTensor {
	sum := sha256.Sum256(data)
	return goldenTensor{Name: p.Name, Seq: p.Seq, Step: p.Step, Forward: p.Forward, DType: p.DType.String(),
		Shape: append([]uint64{}, p.Shape...), Parts: parts, Bytes: len(data), SHA256: hex.EncodeToString(sum[:]),
		FirstValues: values(p.DType, data, nFirst)}
}

func codecName(id codec.ID) string {
	c, err := codec.ByID(id)
	if err != nil {
		return "unknown"
	}
	return c.Name()
}

func roundTripJSON(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func marshalGolden(t *testing.T, g goldenFile) []byte {
	t.Helper()
	b, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestGolden asserts the Writer still produces the golden streams byte for byte;
// -update rewrites them.
func TestGolden(t *testing.T) {
	built := map[string][]byte{}
	descs := map[string]goldenFile{}
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			data, g := buildGolden(t, sc, built, descs)
			built[sc.name], descs[sc.name] = data, g
			js := marshalGolden(t, g)
			sp := filepath.Join(goldenDir, sc.name+".strap")
			jp := filepath.Join(goldenDir, sc.name+".json")
			if *update {
				if err := os.WriteFile(sp, data, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(jp, js, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(sp)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/stream -run Golden -update)", err)
			}
			if !bytes.Equal(data, want) {
				t.Errorf("%s: writer output (%d bytes) differs from golden (%d bytes)", sp, len(data), len(want))
			}
			wantJS, err := os.ReadFile(jp)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(js, wantJS) {
				t.Errorf("%s: description differs from golden", jp)
			}
		})
	}
}

// TestGoldenRead holds the Reader to the golden descriptions: every packet, every whole
// tensor, END, INDEX and the truncation point.
func TestGoldenRead(t *testing.T) {
	jsons, err := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if err != nil || len(jsons) == 0 {
		t.Fatalf("no golden files in %s: %v", goldenDir, err)
	}
	for _, jp := range jsons {
		t.Run(filepath.Base(jp), func(t *testing.T) {
			var g goldenFile
			js, err := os.ReadFile(jp)
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.UseNumber()
			if err := dec.Decode(&g); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(goldenDir, g.Stream))
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(data)) != g.Size {
				t.Fatalf("size %d, want %d", len(data), g.Size)
			}
			r, err := NewReader(bytes.NewReader(data), int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			if r.Header().DataOffset != g.DataOffset {
				t.Errorf("data offset %d, want %d", r.Header().DataOffset, g.DataOffset)
			}
			if !reflect.DeepEqual(jsonNorm(t, r.Header().Meta), jsonNorm(t, g.HeaderMeta)) {
				t.Errorf("header meta %v, want %v", r.Header().Meta, g.HeaderMeta)
			}
			s := r.Scan(false)
			i := 0
			for s.Next() {
				if i >= len(g.Packets) {
					t.Fatalf("more packets than the %d described", len(g.Packets))
				}
				checkPacket(t, r, s.Packet(), s.Payload(), g.Packets[i])
				i++
			}
			if i != len(g.Packets) {
				t.Errorf("read %d packets, want %d", i, len(g.Packets))
			}
			var oe *OffsetError
			switch {
			case g.TruncatedAt != nil:
				if !errors.Is(s.Err(), ErrTruncated) || !errors.As(s.Err(), &oe) || oe.Offset != *g.TruncatedAt {
					t.Errorf("scan error %v, want truncated at %d", s.Err(), *g.TruncatedAt)
				}
			case s.Err() != nil:
				t.Errorf("scan: %v", s.Err())
			}
			ts := r.Tensors()
			i = 0
			for ts.Next() {
				tn := ts.Tensor()
				if i >= len(g.Tensors) {
					t.Fatalf("more tensors than the %d described", len(g.Tensors))
				}
				want := g.Tensors[i]
				sum := sha256.Sum256(tn.Data)
				got := goldenTensor{Name: tn.Name, Seq: tn.Seq, Step: tn.Step, Forward: tn.Forward,
					DType: tn.DType.String(), Shape: append([]uint64{}, tn.Shape...), Parts: tn.Parts,
					Bytes: len(tn.Data), SHA256: hex.EncodeToString(sum[:]), FirstValues: values(tn.DType, tn.Data, nFirst)}
				if !reflect.DeepEqual(jsonNorm(t, got), jsonNorm(t, want)) {
					t.Errorf("tensor %d:\n got %+v\nwant %+v", i, got, want)
				}
				i++
			}
			if i != len(g.Tensors) || ts.Incomplete() != g.IncompleteTensors {
				t.Errorf("%d tensors (%d incomplete), want %d (%d)", i, ts.Incomplete(), len(g.Tensors), g.IncompleteTensors)
			}
			idx, err := r.Index()
			if g.IndexOffset == nil {
				if !errors.Is(err, ErrNoIndex) {
					t.Errorf("Index() = %v, want ErrNoIndex", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if len(idx) != len(g.Index) {
					t.Fatalf("%d index entries, want %d", len(idx), len(g.Index))
				}
				for k, e := range idx {
					got := goldenEntry{Name: e.Name, Type: e.Type.String(), Flags: uint16(e.Flags), Seq: e.Seq, Step: e.Step,
						Forward: e.Forward, Offset: e.Offset}
					if got != g.Index[k] {
						t.Errorf("index %d: %+v, want %+v", k, got, g.Index[k])
					}
				}
			}
			rep := Verify(bytes.NewReader(data), int64(len(data)))
			if wantOK := g.IndexOffset != nil; rep.OK != wantOK || rep.Truncated != (g.TruncatedAt != nil) {
				t.Errorf("verify ok=%v truncated=%v, want %v %v: %v", rep.OK, rep.Truncated, wantOK, g.TruncatedAt != nil, rep.Problems)
			}
		})
	}
}

func checkPacket(t *testing.T, r *Reader, p *PacketInfo, payload []byte, want goldenPacket) {
	t.Helper()
	got := goldenPacket{Offset: p.Offset, Type: p.Type.String(), Seq: p.Seq, Step: p.Step, Forward: p.Forward,
		Name: p.Name, Shape: append([]uint64{}, p.Shape...), Codec: codecName(p.Codec), CodecID: uint8(p.Codec),
		Flags: p.Flags, RawLen: p.RawLen, StoredLen: p.StoredLen, PartOffset: p.PartOffset,
		TensorLen: p.TensorLen, BlockSize: p.BlockSize}
	if p.DType != dtype.Invalid {
		s := p.DType.String()
		got.DType = &s
	}
	if len(p.Meta) > 0 {
		got.Meta = json.RawMessage(p.Meta)
	}
	if p.Type == TypeTensor {
		raw, err := r.Decode(p, payload)
		if err != nil {
			t.Fatalf("decode at %d: %v", p.Offset, err)
		}
		sum := sha256.Sum256(raw)
		got.PayloadSHA256 = hex.EncodeToString(sum[:])
		if len(raw) <= 64 {
			h := hex.EncodeToString(raw)
			got.PayloadHex = &h
		}
		got.FirstValues = values(p.DType, raw, nFirst)
	}
	if !reflect.DeepEqual(jsonNorm(t, got), jsonNorm(t, want)) {
		t.Errorf("packet at %d:\n got %s\nwant %s", p.Offset, mustJSON(got), mustJSON(want))
	}
}

// jsonNorm maps v through JSON so numbers and raw messages compare by value.
func jsonNorm(t *testing.T, v any) any {
	t.Helper()
	b := mustJSON(v)
	var out any
	dec := json.NewDecoder(strings.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return normNumbers(out)
}

func normNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = normNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = normNumbers(x[k])
		}
	}
	return v
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
