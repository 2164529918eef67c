package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// textStream writes a closed stream holding a TENSOR packet named "model.ab" and a TOKEN
// packet whose meta text is "\u00e9ab", so tests can swap those bytes for invalid text of
// the same length.
func textStream(t testing.TB) []byte {
	t.Helper()
	f := tempFile(t)
	w, err := New(f, map[string]any{"model": "ab"})
	if err != nil {
		t.Fatal(err)
	}
	tensor := Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{2}, Seq: 1, RawLen: 8},
		Name: "model.ab", Blocks: []Block{{Data: f32Bytes(1, 2)}}}
	token := Packet{Header: Header{Type: TypeToken, Seq: 2}, Meta: []byte(`{"position":0,"text":"\u00e9ab","token_id":7}`)}
	for _, p := range []*Packet{&tensor, &token} {
		if err := w.WritePacket(p); err != nil {
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
	return b
}

// packetStarts lists the packet offsets of a well-formed stream.
func packetStarts(t testing.TB, b []byte) []int64 {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	s := r.Scan(true)
	for s.Next() {
		offs = append(offs, s.Packet().Offset)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
	return offs
}

// replaceIn overwrites the first old inside b[from:to] with repl (same length) and returns
// where it was.
func replaceIn(t testing.TB, b []byte, from, to int64, old, repl string) int64 {
	t.Helper()
	if len(old) != len(repl) {
		t.Fatalf("replacement changes the length")
	}
	i := bytes.Index(b[from:to], []byte(old))
	if i < 0 {
		t.Fatalf("%q not found in [%d, %d)", old, from, to)
	}
	copy(b[from+int64(i):], repl)
	return from + int64(i)
}

// fixPacketCRC recomputes the CRC32C of the packet at off, so only the text is wrong.
func fixPacketCRC(b []byte, off int64) {
	le := binary.LittleEndian
	end := off + int64(le.Uint32(b[off+8:])) + int64(le.Uint64(b[off+56:]))
	le.PutUint32(b[off+20:], 0)
	le.PutUint32(b[off+20:], crc32.Checksum(b[off:end], castagnoli))
}

// invalidTextStreams are closed streams whose only fault is text that is not Unicode, each
// with the offset and message Verify must report (-1: a problem, not a bad offset).
func invalidTextStreams(t testing.TB) []struct {
	name   string
	data   []byte
	badOff int64
	sub    string
} {
	base := textStream(t)
	offs := packetStarts(t, base)
	if len(offs) != 4 { // TENSOR, TOKEN, END, INDEX
		t.Fatalf("%d packets, want 4", len(offs))
	}
	tensorOff, tokenOff, indexOff := offs[0], offs[1], offs[3]
	size := int64(len(base))
	name := bytes.Clone(base)
	replaceIn(t, name, tensorOff+PacketHeaderLen, tokenOff, "model.ab", "model.\xff\xfe")
	fixPacketCRC(name, tensorOff)
	meta := bytes.Clone(base)
	replaceIn(t, meta, tokenOff+PacketHeaderLen, offs[2], `"\u00e9ab"`, "\"\\u00e9\xc0\xaf\"")
	fixPacketCRC(meta, tokenOff)
	surrogate := bytes.Clone(base)
	replaceIn(t, surrogate, tokenOff+PacketHeaderLen, offs[2], `\u00e9`, `\udcff`)
	fixPacketCRC(surrogate, tokenOff)
	index := bytes.Clone(base)
	replaceIn(t, index, indexOff+PacketHeaderLen, size-FooterLen, "model.ab", "model.\xff\xfe")
	fixPacketCRC(index, indexOff)
	header := bytes.Clone(base)
	replaceIn(t, header, FileHeaderLen, tensorOff, `"ab"`, "\"\xe2\x82\"")
	metaLen := binary.LittleEndian.Uint32(header[12:])
	crc := crc32.Update(crc32.Update(0, castagnoli, header[:16]), castagnoli, header[FileHeaderLen:FileHeaderLen+int(metaLen)])
	binary.LittleEndian.PutUint32(header[16:], crc)
	return []struct {
		name   string
		data   []byte
		badOff int64
		sub    string
	}{
		{"tensor name", name, tensorOff, `packet name "model.\xff\xfe" is not valid UTF-8`},
		{"token meta", meta, tokenOff, `meta of packet "": not valid UTF-8 at byte`},
		{"token meta lone surrogate", surrogate, tokenOff, `unpaired surrogate escape \udcff`},
		{"index name", index, -1, `index payload: name 0 "model.\xff\xfe" is not valid UTF-8`},
		{"file header metadata", header, FileHeaderLen, "metadata: not valid UTF-8"},
	}
}

// TestVerifyInvalidText: names, meta, INDEX names and the header metadata that are not
// valid Unicode make verify fail with a message that says so, although every CRC is right.
func TestVerifyInvalidText(t *testing.T) {
	base := textStream(t)
	if rep := Verify(bytes.NewReader(base), int64(len(base))); !rep.OK {
		t.Fatalf("base stream: %v", rep.Problems)
	}
	for _, tc := range invalidTextStreams(t) {
		t.Run(tc.name, func(t *testing.T) {
			rep := Verify(bytes.NewReader(tc.data), int64(len(tc.data)))
			if rep.OK || rep.Truncated {
				t.Fatalf("ok=%v truncated=%v: %v", rep.OK, rep.Truncated, rep.Problems)
			}
			if rep.FirstBadOffset != tc.badOff {
				t.Fatalf("first bad offset %d, want %d: %v", rep.FirstBadOffset, tc.badOff, rep.Problems)
			}
			if !strings.Contains(strings.Join(rep.Problems, "\n"), tc.sub) {
				t.Fatalf("problems %q, want one containing %q", rep.Problems, tc.sub)
			}
			var buf bytes.Buffer
			if err := rep.WriteText(&buf); err != nil || !strings.Contains(buf.String(), tc.sub) {
				t.Fatalf("text report lacks %q:\n%s", tc.sub, buf.String())
			}
		})
	}
}

// TestReaderInvalidText: every read path refuses the text with ErrCorrupt: whole packets,
// header-only scans (no CRC), and the INDEX.
func TestReaderInvalidText(t *testing.T) {
	for _, tc := range invalidTextStreams(t) {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewReader(bytes.NewReader(tc.data), int64(len(tc.data)))
			if tc.name == "file header metadata" {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("NewReader: %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.badOff >= 0 {
				for _, headersOnly := range []bool{false, true} {
					s := r.Scan(headersOnly)
					for s.Next() {
					}
					if !errors.Is(s.Err(), ErrCorrupt) || !strings.Contains(s.Err().Error(), tc.sub) {
						t.Fatalf("scan(headersOnly=%v): %v, want ErrCorrupt containing %q", headersOnly, s.Err(), tc.sub)
					}
				}
				return
			}
			if _, err := r.Index(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.sub) {
				t.Fatalf("Index: %v, want ErrCorrupt containing %q", err, tc.sub)
			}
		})
	}
}

// TestCRCBeforeText: a damaged name byte with a stale CRC is reported as a CRC failure
// (damage), not as bad text, by every read path.
func TestCRCBeforeText(t *testing.T) {
	b := textStream(t)
	off := packetStarts(t, b)[0]
	replaceIn(t, b, off+PacketHeaderLen, packetStarts(t, b)[1], "model.ab", "model.\xff\xfe")
	r, err := NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.ReadPacket(off); !errors.Is(err, ErrBadCRC) {
		t.Fatalf("ReadPacket: %v, want ErrBadCRC", err)
	}
	// A header-only read checks no CRC of its own, but bad text makes it look.
	if _, err := r.ReadHeader(off); !errors.Is(err, ErrBadCRC) {
		t.Fatalf("ReadHeader: %v, want ErrBadCRC", err)
	}
	if rep := Verify(bytes.NewReader(b), int64(len(b))); rep.FirstBadOffset != off || !strings.Contains(rep.Error, "crc") {
		t.Fatalf("verify: first bad %d (want %d), error %q", rep.FirstBadOffset, off, rep.Error)
	}
}
