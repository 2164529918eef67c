package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

func TestWriteReadRoundTrip(t *testing.T) {
	big := normalF32(300_000, 0.25, 5) // 1.2 MB: goes out through writev, not the buffer
	for _, name := range []string{"none", "lz4", "zstd"} {
		t.Run(name, func(t *testing.T) {
			c := mustCodec(t, name)
			f := tempFile(t)
			w, err := New(f, map[string]any{"codec": name})
			if err != nil {
				t.Fatal(err)
			}
			type rec struct {
				name string
				raw  []byte
			}
			var recs []rec
			seq := uint64(0)
			for i := range 40 {
				raw := normalF32(100+i*37, 0.25, uint64(i))
				if i%10 == 3 {
					raw = big
				}
				seq++
				p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{uint64(len(raw) / 4)}, Codec: c.ID(), Seq: seq, Step: uint64(i), Forward: uint64(i), RawLen: uint64(len(raw))}, Name: filepath.Join("layer", string(rune('a'+i%5)))}
				if c.ID() != codec.None {
					p.BlockSize = 1 << 16
				}
				p.Blocks = blocksFor(t, c, dtype.Float32, raw, 1<<16)
				if c.ID() == codec.None {
					// Split across several slices as a wrapped ring record would be.
					p.Blocks = []Block{{Data: raw[:len(raw)/3]}, {Data: raw[len(raw)/3 : len(raw)/2]}, {Data: raw[len(raw)/2:]}}
				}
				off := w.Offset()
				if err := w.WritePacket(&p); err != nil {
					t.Fatal(err)
				}
				if w.Offset() <= off {
					t.Fatal("offset did not advance")
				}
				recs = append(recs, rec{p.Name, raw})
				if i == 20 {
					if err := w.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if w.Packets() != 40 {
				t.Fatalf("Packets() = %d", w.Packets())
			}
			if err := w.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(EndInfo{Status: "complete"}); !errors.Is(err, ErrClosed) {
				t.Fatalf("second Close: %v", err)
			}
			if err := w.WritePacket(&Packet{Header: Header{Type: TypeToken, Seq: 99}}); !errors.Is(err, ErrClosed) {
				t.Fatalf("write after close: %v", err)
			}
			st, _ := f.Stat()
			if st.Size() != w.Offset() {
				t.Fatalf("file %d bytes, Offset %d", st.Size(), w.Offset())
			}
			rep := Verify(f, st.Size())
			if !rep.OK || rep.Tensors != 40 || rep.LastSeq != 40 {
				t.Fatalf("verify: %+v", rep)
			}
			r, err := NewReader(f, st.Size())
			if err != nil {
				t.Fatal(err)
			}
			ts := r.Tensors()
			i := 0
			for ts.Next() {
				tn := ts.Tensor()
				if tn.Name != recs[i].name || !bytes.Equal(tn.Data, recs[i].raw) {
					t.Fatalf("tensor %d differs", i)
				}
				i++
			}
			if ts.Err() != nil || i != 40 {
				t.Fatalf("read %d tensors: %v", i, ts.Err())
			}
			entries, fromIndex, err := r.Entries()
			if err != nil || !fromIndex || len(entries) != 40 {
				t.Fatalf("entries %d fromIndex=%v: %v", len(entries), fromIndex, err)
			}
		})
	}
}

func TestWritePacketInvalid(t *testing.T) {
	raw := f32Bytes(1, 2, 3, 4)
	lz, _ := codec.New("lz4", codec.Options{})
	good := Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{2, 2}, Seq: 1, RawLen: 16}, Name: "m", Blocks: []Block{{Data: raw}}}
	tests := []struct {
		name string
		mod  func(p *Packet)
	}{
		{"index_type", func(p *Packet) { p.Type = TypeIndex }},
		{"end_type", func(p *Packet) { p.Type = TypeEnd }},
		{"bad_type", func(p *Packet) { p.Type = 9 }},
		{"seq_zero", func(p *Packet) { p.Seq = 0 }},
		{"ndim_9", func(p *Packet) { p.Shape = make([]uint64, 9) }},
		{"shape_mismatch", func(p *Packet) { p.Shape = []uint64{3} }},
		{"shape_overflow", func(p *Packet) { p.Shape = []uint64{1 << 40, 1 << 40} }},
		{"bad_dtype", func(p *Packet) { p.DType = 99 }},
		{"raw_len_mismatch", func(p *Packet) { p.RawLen = 12 }},
		{"none_with_block_size", func(p *Packet) { p.BlockSize = 4 }},
		{"meta_not_object", func(p *Packet) { p.Meta = []byte(`[1]`) }},
		{"meta_bad_json", func(p *Packet) { p.Meta = []byte(`{"a":`) }},
		{"unknown_flag", func(p *Packet) { p.Flags = 2 }},
		{"part_past_end", func(p *Packet) { p.Flags = FlagPart; p.TensorLen = 16; p.PartOffset = 8 }},
		{"not_part_with_offset", func(p *Packet) { p.PartOffset = 4 }},
		{"unknown_codec", func(p *Packet) { p.Codec = 63; p.BlockSize = 16 }},
		{"lz4_no_block_size", func(p *Packet) { p.Codec = codec.LZ4 }},
		{"lz4_block_count", func(p *Packet) { p.Codec = codec.LZ4; p.BlockSize = 4 }},
		{"lz4_raw_block_size", func(p *Packet) {
			p.Codec, p.BlockSize = codec.LZ4, 16
			p.Blocks = []Block{{Data: raw[:8], Raw: true}}
		}},
		{"drop_with_payload", func(p *Packet) { p.Type = TypeDrop }},
		{"token_with_payload", func(p *Packet) { p.Type = TypeToken; p.DType = 0; p.Shape = nil; p.RawLen = 0 }},
		{"long_name", func(p *Packet) { p.Name = string(make([]byte, 70000)) }},
		{"name_not_utf8", func(p *Packet) { p.Name = "model.\xff\xfe" }},
		{"meta_not_utf8", func(p *Packet) { p.Meta = []byte("{\"text\":\"\xff\"}") }},
		{"meta_lone_surrogate", func(p *Packet) { p.Meta = []byte(`{"text":"\udcff"}`) }},
	}
	_ = lz
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := New(tempFile(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			p := good
			p.Blocks = append([]Block(nil), good.Blocks...)
			tt.mod(&p)
			off := w.Offset()
			if err := w.WritePacket(&p); !errors.Is(err, ErrInvalidPacket) {
				t.Fatalf("got %v, want ErrInvalidPacket", err)
			}
			if w.Offset() != off || w.Packets() != 0 {
				t.Fatal("invalid packet was written")
			}
			// The writer is still usable.
			q := good
			if err := w.WritePacket(&q); err != nil {
				t.Fatalf("valid packet after invalid one: %v", err)
			}
		})
	}
	w, _ := New(tempFile(t), nil)
	if err := w.Close(EndInfo{Status: "fine"}); !errors.Is(err, ErrInvalidPacket) {
		t.Fatalf("bad end status: %v", err)
	}
}

// TestWriteErrorSticks writes into /dev/full: ENOSPC comes back from WritePacket or
// Close, never swallowed, and every later call returns it.
func TestWriteErrorSticks(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer f.Close()
	w, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{1 << 20}, Seq: 1, RawLen: 1 << 20}, Name: "m", Blocks: []Block{{Data: big}}}
	err = w.WritePacket(&p)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("WritePacket: %v, want ENOSPC", err)
	}
	p.Seq = 2
	if err2 := w.WritePacket(&p); !errors.Is(err2, syscall.ENOSPC) {
		t.Fatalf("second WritePacket: %v", err2)
	}
	if err := w.Close(EndInfo{Status: "error", Error: err.Error()}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Close: %v", err)
	}

	// Small packets are buffered: the error surfaces at Sync.
	f2, _ := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	defer f2.Close()
	w2, _ := New(f2, nil)
	if err := w2.WritePacket(&Packet{Header: Header{Type: TypeToken, Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := w2.Sync(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Sync: %v", err)
	}
}

func TestDevNull(t *testing.T) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	w, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 1<<20)
	p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{1 << 20}, Seq: 1, RawLen: 1 << 20}, Name: "m", Blocks: []Block{{Data: raw}}}
	if err := w.WritePacket(&p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
}

// TestNotRetained: WritePacket's caller may reuse its slices (the ring) as soon as it
// returns, whichever path the packet took.
func TestNotRetained(t *testing.T) {
	f := tempFile(t)
	w, _ := New(f, nil)
	sizes := []int{16, copyMax * 2}
	var want [][]byte
	for i, n := range sizes {
		buf := bytes.Repeat([]byte{byte(i + 1)}, n)
		p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(n)}, Seq: uint64(i + 1), RawLen: uint64(n)}, Name: "m", Blocks: []Block{{Data: buf}}}
		if err := w.WritePacket(&p); err != nil {
			t.Fatal(err)
		}
		want = append(want, bytes.Clone(buf))
		clear(buf) // the ring slot is reused
	}
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	r, err := NewReader(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	ts := r.Tensors()
	for i := 0; ts.Next(); i++ {
		if !bytes.Equal(ts.Tensor().Data, want[i]) {
			t.Fatalf("tensor %d changed after WritePacket returned", i)
		}
	}
	if ts.Err() != nil {
		t.Fatal(ts.Err())
	}
}

func TestNewTruncatesAndOffsets(t *testing.T) {
	f := tempFile(t)
	if _, err := f.Write(bytes.Repeat([]byte("x"), 10000)); err != nil {
		t.Fatal(err)
	}
	w, err := New(f, map[string]any{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	if w.Offset()%8 != 0 || w.Offset() != align8(FileHeaderLen+int64(len(`{"a":1}`))) {
		t.Fatalf("data offset %d", w.Offset())
	}
	if err := w.Close(EndInfo{Status: "aborted"}); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	if st.Size() != w.Offset() {
		t.Fatalf("old bytes left: size %d, offset %d", st.Size(), w.Offset())
	}
	rep := Verify(f, st.Size())
	if !rep.OK || rep.End == nil || rep.End.Status != "aborted" {
		t.Fatalf("%+v", rep)
	}
}

func TestAbort(t *testing.T) {
	f := tempFile(t)
	w, _ := New(f, nil)
	_ = w.WritePacket(&Packet{Header: Header{Type: TypeDrop, Seq: 1, RawLen: 100}, Name: "m", Meta: []byte(`{"reason":"ring_full"}`)})
	if err := w.Abort(errors.New("codec failed")); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	rep := Verify(f, st.Size())
	if !rep.OK || rep.End.Status != "error" || rep.End.Error != "codec failed" || rep.End.Drops != 1 || rep.End.Packets != 1 {
		t.Fatalf("%+v %+v", rep, rep.End)
	}
}

// writeSeqs writes TOKEN packets with the given seqs and closes the stream.
func writeSeqs(t *testing.T, seqs ...uint64) []byte {
	t.Helper()
	f := tempFile(t)
	w, _ := New(f, nil)
	for _, s := range seqs {
		if err := w.WritePacket(&Packet{Header: Header{Type: TypeToken, Seq: s}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(f.Name())
	return b
}

func TestVerify(t *testing.T) {
	golden := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(goldenDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	basic := golden("none_basic.strap")
	flipped := bytes.Clone(basic)
	flipped[700] ^= 1 // inside a packet: its CRC fails
	lied := bytes.Clone(basic)
	// Make the first packet's stored_len point past the end: a lie, not a cut (footer intact).
	binary.LittleEndian.PutUint64(lied[288+56:], 1<<40)
	tests := []struct {
		name      string
		data      []byte
		ok        bool
		truncated bool
		badOff    int64
		gaps      []SeqRange
		repeats   uint64
	}{
		{"complete", basic, true, false, -1, nil, 0},
		{"truncated", golden("none_truncated.strap"), false, true, 1028 - 50, nil, 0},
		{"cut_at_packet", golden("none_cut_at_packet.strap"), false, false, -1, nil, 0},
		{"flipped_byte", flipped, false, false, -2, nil, 0},
		{"lying_length", lied, false, false, 288, nil, 0},
		{"seq_gap", writeSeqs(t, 1, 2, 5, 6), false, false, -1, []SeqRange{{3, 4}}, 0},
		{"seq_repeat", writeSeqs(t, 1, 2, 2, 3), false, false, -1, nil, 1},
		{"seq_from_one", writeSeqs(t, 1, 2, 3), true, false, -1, nil, 0},
		{"empty_file", nil, false, true, 0, nil, 0},
		{"not_a_stream", []byte("hello, this is not a stream file at all"), false, false, 0, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Verify(bytes.NewReader(tt.data), int64(len(tt.data)))
			if rep.OK != tt.ok || rep.Truncated != tt.truncated {
				t.Fatalf("ok=%v truncated=%v, want %v %v: %v", rep.OK, rep.Truncated, tt.ok, tt.truncated, rep.Problems)
			}
			if tt.badOff == -2 {
				if rep.FirstBadOffset < 0 {
					t.Fatalf("no bad offset: %v", rep.Problems)
				}
			} else if rep.FirstBadOffset != tt.badOff {
				t.Fatalf("first bad offset %d, want %d: %v", rep.FirstBadOffset, tt.badOff, rep.Problems)
			}
			if len(rep.SeqGaps) != len(tt.gaps) || (len(tt.gaps) > 0 && rep.SeqGaps[0] != tt.gaps[0]) || rep.SeqRepeats != tt.repeats {
				t.Fatalf("gaps %v repeats %d", rep.SeqGaps, rep.SeqRepeats)
			}
			var buf bytes.Buffer
			if err := rep.WriteText(&buf); err != nil || buf.Len() == 0 {
				t.Fatal("no text report")
			}
		})
	}
}

// TestEveryByteFlip: a flipped bit anywhere in a closed stream is caught by Verify, and
// a flip inside a packet is reported at that packet's offset.
func TestEveryByteFlip(t *testing.T) {
	for _, name := range []string{"none_basic.strap", "lz4_mixed.strap"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(goldenDir, name))
			if err != nil {
				t.Fatal(err)
			}
			r, _ := NewReader(bytes.NewReader(data), int64(len(data)))
			var starts []int64
			s := r.Scan(true)
			for s.Next() {
				starts = append(starts, s.Packet().Offset)
			}
			step := 1
			if len(data) > 4000 {
				step = 7
			}
			for i := 0; i < len(data); i += step {
				d := bytes.Clone(data)
				d[i] ^= 0x10
				rep := Verify(bytes.NewReader(d), int64(len(d)))
				if rep.OK {
					t.Fatalf("flip at %d not detected", i)
				}
				// Packet whose bytes include i.
				var pkt int64 = -1
				for _, o := range starts {
					if int64(i) >= o {
						pkt = o
					}
				}
				if pkt >= 0 && int64(i) < int64(len(data))-FooterLen && rep.FirstBadOffset >= 0 && rep.FirstBadOffset > pkt {
					t.Fatalf("flip at %d (packet %d) reported at %d", i, pkt, rep.FirstBadOffset)
				}
			}
		})
	}
}

func TestInspect(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(goldenDir, "lz4_mixed.strap"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := Inspect(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Modules) != 5 || sum.Packets != 6 || sum.Drops != 1 || sum.DroppedBytes != 4096 {
		t.Fatalf("%+v", sum)
	}
	if sum.End == nil || sum.End.Status != "complete" || sum.Error != "" {
		t.Fatalf("end %+v err %q", sum.End, sum.Error)
	}
	var lm *ModuleStats
	for i := range sum.Modules {
		if sum.Modules[i].Name == "lm_head" {
			lm = &sum.Modules[i]
		}
	}
	if lm == nil || lm.Packets != 2 || lm.RawBytes != 8192 || len(lm.Shapes) != 1 || lm.Shapes[0][1] != 256 {
		t.Fatalf("lm_head: %+v", lm)
	}
	if sum.Ratio <= 1 {
		t.Fatalf("ratio %v: zeros should compress", sum.Ratio)
	}
	var buf bytes.Buffer
	if err := sum.WriteText(&buf); err != nil || !bytes.Contains(buf.Bytes(), []byte("lm_head")) {
		t.Fatalf("text: %v\n%s", err, buf.String())
	}
	trunc, _ := os.ReadFile(filepath.Join(goldenDir, "none_truncated.strap"))
	sum, err = Inspect(bytes.NewReader(trunc), int64(len(trunc)))
	if err != nil || sum.End != nil || sum.Error == "" || sum.Packets != 4 || sum.Tokens != 1 {
		t.Fatalf("truncated: %+v %v", sum, err)
	}
}

func TestEntriesFallback(t *testing.T) {
	data, _ := os.ReadFile(filepath.Join(goldenDir, "none_cut_at_packet.strap"))
	r, err := NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Index(); !errors.Is(err, ErrNoIndex) {
		t.Fatalf("Index: %v", err)
	}
	entries, fromIndex, err := r.Entries()
	if err != nil || fromIndex || len(entries) != 7 || entries[6].Type != TypeDrop {
		t.Fatalf("%d entries fromIndex=%v err=%v", len(entries), fromIndex, err)
	}
}

// TestHostileHeaders: lying lengths give errors naming the offset, without allocating
// what they claim.
func TestHostileHeaders(t *testing.T) {
	basic, _ := os.ReadFile(filepath.Join(goldenDir, "none_basic.strap"))
	mod := func(f func(b []byte)) []byte { b := bytes.Clone(basic); f(b); return b }
	le := binary.LittleEndian
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"meta_len_huge", mod(func(b []byte) { le.PutUint32(b[12:], 0xffffffff) }), ErrTruncated},
		{"bad_version", mod(func(b []byte) { le.PutUint16(b[8:], 1) }), ErrBadVersion},
		{"header_crc", mod(func(b []byte) { b[30] ^= 1 }), ErrBadCRC},
		{"old_format", []byte{0, 5, 0, 0, 0, 4, 'n', 'a', 'm', 'e', 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrBadMagic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tt.data), int64(len(tt.data)))
			var oe *OffsetError
			if !errors.Is(err, tt.want) || !errors.As(err, &oe) {
				t.Fatalf("got %v, want %v with an offset", err, tt.want)
			}
		})
	}
	pk := []struct {
		name string
		f    func(b []byte)
		want error
	}{
		{"stored_len_huge", func(b []byte) { le.PutUint64(b[288+56:], 1<<62) }, ErrTruncated},
		{"ndim_9", func(b []byte) { b[288+7] = 9 }, ErrCorrupt},
		{"header_len_lie", func(b []byte) { le.PutUint32(b[288+8:], 1<<31) }, ErrCorrupt},
		{"packet_magic", func(b []byte) { b[288] = 'X' }, ErrBadMagic},
		{"packet_crc", func(b []byte) { b[288+96+8*2+3] ^= 1 }, ErrBadCRC},
	}
	for _, tt := range pk {
		t.Run(tt.name, func(t *testing.T) {
			d := mod(tt.f)
			r, err := NewReader(bytes.NewReader(d), int64(len(d)))
			if err != nil {
				t.Fatal(err)
			}
			s := r.Scan(false)
			for s.Next() {
			}
			var oe *OffsetError
			if !errors.Is(s.Err(), tt.want) || !errors.As(s.Err(), &oe) || oe.Offset != 288 {
				t.Fatalf("got %v, want %v at 288", s.Err(), tt.want)
			}
		})
	}
}

// TestSharedPayloadChangedWhileWritten: a payload another party rewrites while it is being
// written (a client writing into published ring bytes) never leaves a packet whose CRC
// does not cover its bytes. A large packet that changed between its CRC and its writev is
// ErrPayloadChanged and cut off the file again; a small one is CRC-checked over the copy
// that is written, so it always verifies. Either way the stream reads clean to its END.
func TestSharedPayloadChangedWhileWritten(t *testing.T) {
	for _, tc := range []struct {
		name        string
		size        int
		wantChanged bool
	}{
		{"writev from shared memory", 4 << 20, true},
		{"copied into the buffer", 64 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Outside the Go heap, like the ring: the rewriting goroutine stands in for the
			// client process.
			mem, err := syscall.Mmap(-1, 0, tc.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Munmap(mem)
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					mem[(i*4099)%len(mem)]++
				}
			}()
			f := tempFile(t)
			w, err := New(f, nil)
			if err != nil {
				t.Fatal(err)
			}
			seq, changed := uint64(0), 0
			for range 40 {
				seq++
				p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(mem))},
					Seq: seq, RawLen: uint64(len(mem))}, Name: "x", Blocks: []Block{{Data: mem}}, Shared: true}
				before := w.Offset()
				switch err := w.WritePacket(&p); {
				case errors.Is(err, ErrPayloadChanged):
					changed++
					seq-- // not written: the next packet takes its number
					if st, _ := f.Stat(); st.Size() != before || w.Offset() != before {
						t.Fatalf("changed packet left in the file: size %d, offset %d, packet started at %d", st.Size(), w.Offset(), before)
					}
				case err != nil:
					t.Fatal(err)
				}
			}
			close(stop)
			<-done
			if err := w.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			if tc.wantChanged != (changed > 0) {
				t.Fatalf("%d of 40 packets changed while written, want changes: %v", changed, tc.wantChanged)
			}
			st, _ := f.Stat()
			rep := Verify(f, st.Size())
			if !rep.OK || rep.Tensors != seq {
				t.Fatalf("verify: %+v", rep)
			}
		})
	}
}

// TestReleasedArraysReused: a Writer that takes a released Writer's index arrays (longer,
// and full of another stream's entries) writes the same bytes as one that starts empty.
func TestReleasedArraysReused(t *testing.T) {
	write := func(names []string, n int) (*Writer, []byte) {
		t.Helper()
		f := tempFile(t)
		w, err := New(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			raw := normalF32(64, 0.25, uint64(i))
			p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{64}, Codec: codec.None,
				Seq: uint64(i + 1), Step: uint64(i), RawLen: uint64(len(raw))}, Name: names[i%len(names)], Blocks: []Block{{Data: raw}}}
			if err := w.WritePacket(&p); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		return w, b
	}
	small := []string{"a", "b"}
	w, want := write(small, 3)
	w.Release()
	reused := 0
	for range 10 {
		w, _ := write([]string{"model.layers.0.mlp", "model.layers.0.self_attn", "x"}, 500)
		w.Release()
		f := tempFile(t)
		w2, err := New(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cap(w2.index) >= 500 && cap(w2.payload) > 0 {
			reused++
		}
		w2.Release()
		w3, got := write(small, 3)
		w3.Release()
		if !bytes.Equal(got, want) {
			t.Fatal("a writer on recycled arrays wrote other bytes")
		}
	}
	if reused == 0 {
		t.Fatal("no writer took a released writer's arrays")
	}
}
