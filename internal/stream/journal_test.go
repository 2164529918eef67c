package stream

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// journalCapture writes ps with a checkpoint every `every` packets and returns the
// journal records a freeing upload would have written at those checkpoints, the
// checkpoints' facts and the writer (still open).
func journalCapture(t *testing.T, f *os.File, ps []Packet, every int) ([]JournalRecord, []ResumeExpect, *Writer) {
	t.Helper()
	w, err := New(f, map[string]any{"model_class": "T"})
	if err != nil {
		t.Fatal(err)
	}
	var recs []JournalRecord
	var cks []ResumeExpect
	var start int64
	indexed := 0
	for i := range ps {
		if err := w.WritePacket(&ps[i]); err != nil {
			t.Fatal(err)
		}
		if (i+1)%every != 0 {
			continue
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		if start == 0 {
			r, err := NewReader(f, w.Offset())
			if err != nil {
				t.Fatal(err)
			}
			start = r.Header().DataOffset
		}
		lo, lc := w.LastPacket()
		recs = append(recs, JournalRecord{Start: start, End: w.Offset(), Packets: w.Packets(), Drops: w.Drops(), Tokens: w.Tokens(),
			LastSeq: w.LastSeq(), LastOffset: lo, LastCRC: lc, Entries: w.IndexFrom(indexed)})
		cks = append(cks, ResumeExpect{AppendAt: w.Offset(), LastSeq: w.LastSeq(), LastCRC: lc, Packets: w.Packets()})
		indexed, start = w.IndexLen(), w.Offset()
	}
	return recs, cks, w
}

func encodeJournal(recs []JournalRecord) []byte {
	var b []byte
	for _, r := range recs {
		b = append(b, EncodeJournalRecord(r)...)
	}
	return b
}

func TestJournalRoundTripAndChecks(t *testing.T) {
	ps := resumePackets(60)
	recs, _, w := journalCapture(t, tempFile(t), ps, 9)
	if len(recs) != 6 {
		t.Fatalf("%d records", len(recs))
	}
	b := encodeJournal(recs)
	j, err := ParseJournal(b)
	if err != nil {
		t.Fatal(err)
	}
	if j.Valid != int64(len(b)) || j.Torn != 0 || len(j.Entries) != 54 || j.End() != recs[5].End {
		t.Fatalf("parsed: valid %d torn %d entries %d end %d", j.Valid, j.Torn, len(j.Entries), j.End())
	}
	all := w.IndexFrom(0)
	for i, e := range j.Entries {
		if !sameEntry(e, all[i]) {
			t.Fatalf("entry %d: %+v, the writer's %+v", i, e, all[i])
		}
	}
	entries, rec, ok := j.Upto(recs[3].End + 5)
	if !ok || rec.End != recs[3].End || len(entries) != 36 || j.BytesUpto(recs[3].End+5) != int64(len(encodeJournal(recs[:4]))) {
		t.Fatalf("Upto: ok %v end %d entries %d", ok, rec.End, len(entries))
	}
	if _, _, ok := j.Upto(recs[0].End - 1); ok {
		t.Fatal("Upto before the first record's end found one")
	}

	// A torn last append is not an error: it is reported and left out.
	for _, cut := range []int{1, journalHeaderLen - 1, journalHeaderLen + 3, len(EncodeJournalRecord(recs[5])) - 1} {
		tb := b[:len(b)-cut]
		j, err := ParseJournal(tb)
		if err != nil || len(j.Records) != 5 || j.Torn != int64(len(EncodeJournalRecord(recs[5]))-cut) {
			t.Fatalf("cut %d: %v, %d records, torn %d", cut, err, len(j.Records), j.Torn)
		}
	}
	last := append([]byte(nil), b...)
	last[len(last)-10] ^= 1 // the last record's content: a torn write
	if j, err := ParseJournal(last); err != nil || len(j.Records) != 5 || j.Torn == 0 {
		t.Fatalf("damaged last record: %v", err)
	}

	bad := func(name string, mod func([]JournalRecord) []JournalRecord) {
		t.Helper()
		rs := append([]JournalRecord(nil), recs...)
		for i := range rs {
			rs[i].Entries = append([]IndexEntry(nil), rs[i].Entries...)
		}
		rs = mod(rs)
		if _, err := ParseJournal(encodeJournal(rs)); !errors.Is(err, ErrBadJournal) {
			t.Errorf("%s: %v, want ErrBadJournal", name, err)
		}
	}
	bad("gap", func(rs []JournalRecord) []JournalRecord { return append(rs[:2], rs[3:]...) })
	bad("packets", func(rs []JournalRecord) []JournalRecord { rs[2].Packets++; return rs })
	bad("drops", func(rs []JournalRecord) []JournalRecord { rs[2].Drops++; return rs })
	bad("tokens", func(rs []JournalRecord) []JournalRecord { rs[4].Tokens--; return rs })
	bad("last seq", func(rs []JournalRecord) []JournalRecord { rs[1].LastSeq++; return rs })
	bad("last offset", func(rs []JournalRecord) []JournalRecord { rs[1].LastOffset--; return rs })
	bad("entry outside", func(rs []JournalRecord) []JournalRecord { rs[1].Entries[0].Offset = rs[1].End; return rs })
	bad("entries out of order", func(rs []JournalRecord) []JournalRecord {
		e := rs[3].Entries
		e[0], e[1] = e[1], e[0]
		return rs
	})
	bad("token step", func(rs []JournalRecord) []JournalRecord {
		for i, e := range rs[2].Entries {
			if e.Type == TypeToken {
				rs[2].Entries[i].Step += 2
				break
			}
		}
		return rs
	})
	// A damaged record followed by more is corruption, not a torn append.
	mid := append([]byte(nil), b...)
	mid[journalHeaderLen+20] ^= 1
	if _, err := ParseJournal(mid); !errors.Is(err, ErrBadJournal) {
		t.Errorf("damaged first record: %v", err)
	}
}

// punch frees [off, off+n) of f, skipping the test where the file system cannot.
func punch(t *testing.T, f *os.File, off, n int64) {
	t.Helper()
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("the test directory's file system cannot punch holes: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestResumeFreedPrefix: a stream whose start was freed (as an upload with
// --upload-free-local leaves it) resumes from its index journal and the bytes still
// there; its final INDEX, and every byte not freed, equal the uninterrupted stream's.
func TestResumeFreedPrefix(t *testing.T) {
	ps := resumePackets(900)
	ref := tempFile(t)
	_, _, rw := journalCapture(t, ref, ps, 30)
	if err := rw.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, ref)
	wantIdx := mustIndex(t, want)

	prepare := func(t *testing.T) (*os.File, []JournalRecord, []ResumeExpect, int64) {
		f := tempFile(t)
		recs, cks, w := journalCapture(t, f, ps[:600], 30)
		// The client dies after more packets; its session's END/INDEX follow.
		writeAll(t, w, ps[600:607])
		if err := w.Abort(nil); err != nil {
			t.Fatal(err)
		}
		// Freed up to the last packet of checkpoint 10 (4 KiB aligned), from the first
		// 4 KiB boundary after the header.
		to := recs[9].LastOffset &^ 4095
		punch(t, f, 4096, to-4096)
		if s, e, ok, err := FreedRange(f, 0, cks[15].AppendAt); err != nil || !ok || s != 4096 || e != to {
			t.Fatalf("FreedRange = %d, %d, %v, %v; want 4096, %d", s, e, ok, err, to)
		}
		return f, recs, cks, to
	}

	for _, at := range []int{11, 15, 19} { // resumed at checkpoint `at` (index in cks)
		f, recs, cks, _ := prepare(t)
		g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		j, err := ParseJournal(encodeJournal(recs))
		if err != nil {
			t.Fatal(err)
		}
		e := cks[at]
		// Between checkpoints too: the journal's last record before append_at is used.
		e.Journal = j
		w2, err := Resume(g, e)
		if err != nil {
			t.Fatalf("resume at checkpoint %d: %v", at, err)
		}
		if w2.Packets() != uint64(30*(at+1)) || w2.Tokens() != uint64(10*(at+1)) || w2.JournaledEntries() == 0 || w2.JournaledEntries() > 30*(at+1) {
			t.Fatalf("resumed: %d packets, %d tokens", w2.Packets(), w2.Tokens())
		}
		writeAll(t, w2, ps[30*(at+1):])
		if err := w2.Close(EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
		got := readAll(t, g)
		g.Close()
		if len(got) != len(want) {
			t.Fatalf("resumed stream %d bytes, uninterrupted %d", len(got), len(want))
		}
		to := recs[9].LastOffset &^ 4095
		if !bytes.Equal(got[:4096], want[:4096]) || !bytes.Equal(got[to:], want[to:]) {
			t.Fatal("bytes outside the freed range differ from the uninterrupted stream")
		}
		if !bytes.Equal(got[4096:to], make([]byte, to-4096)) {
			t.Fatal("the freed range does not read as zeros")
		}
		if gotIdx := mustIndex(t, got); len(gotIdx) != len(wantIdx) {
			t.Fatalf("INDEX has %d entries, uninterrupted %d", len(gotIdx), len(wantIdx))
		} else {
			for i := range gotIdx {
				if !sameEntry(gotIdx[i], wantIdx[i]) {
					t.Fatalf("INDEX entry %d: %+v, uninterrupted %+v", i, gotIdx[i], wantIdx[i])
				}
			}
		}
		// The INDEX payload itself, byte for byte: the footer's INDEX packet onwards.
		if !bytes.Equal(got[indexOffset(t, got):], want[indexOffset(t, want):]) {
			t.Fatal("INDEX packet differs from the uninterrupted stream's")
		}
	}

	refuse := func(name, wantMsg string, mod func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect)) {
		t.Run(name, func(t *testing.T) {
			f, recs, cks, _ := prepare(t)
			e := cks[15]
			mod(&e, recs, cks)
			g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			size, _ := g.Seek(0, 2)
			_, err = Resume(g, e)
			if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), wantMsg) {
				t.Fatalf("Resume = %v, want ErrResumeMismatch with %q", err, wantMsg)
			}
			if st, _ := g.Stat(); st.Size() != size {
				t.Fatal("a refused resume changed the file")
			}
		})
	}
	refuse("no journal", "no index journal", func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect) {})
	refuse("journal short of the freed bytes", "describes the stream only up to", func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect) {
		e.Journal, _ = ParseJournal(encodeJournal(recs[:9]))
	})
	refuse("count differs", "packets", func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect) {
		e.Journal, _ = ParseJournal(encodeJournal(recs))
		e.Packets++
	})
	refuse("last crc differs", "crc", func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect) {
		e.Journal, _ = ParseJournal(encodeJournal(recs))
		e.LastCRC ^= 1
	})
	refuse("append_at inside the freed bytes", "its last packet", func(e *ResumeExpect, recs []JournalRecord, cks []ResumeExpect) {
		e.Journal, _ = ParseJournal(encodeJournal(recs))
		*e = cks[5]
		e.Journal, _ = ParseJournal(encodeJournal(recs))
	})
}

// TestFreedRangeIgnoresZeros: bytes written as zeros are data, not freed.
func TestFreedRangeIgnoresZeros(t *testing.T) {
	f := tempFile(t)
	if _, err := f.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := FreedRange(f, 0, 64<<10); ok || err != nil {
		t.Fatalf("FreedRange over written zeros: %v, %v", ok, err)
	}
	punch(t, f, 8192, 16384)
	if s, e, ok, err := FreedRange(f, 0, 64<<10); !ok || err != nil || s != 8192 || e != 24576 {
		t.Fatalf("FreedRange = %d, %d, %v, %v", s, e, ok, err)
	}
	if _, _, ok, _ := FreedRange(f, 24576, 64<<10); ok {
		t.Fatal("a hole reported after the freed range")
	}
}

func mustIndex(t *testing.T, b []byte) []IndexEntry {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := r.Index()
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

func indexOffset(t *testing.T, b []byte) int64 {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	off, err := r.Footer()
	if err != nil {
		t.Fatal(err)
	}
	return off
}

// FuzzParseJournal treats arbitrary bytes as an index journal (a file strapd reads back
// from its state directory): no panic, and what parses encodes back to the same bytes.
func FuzzParseJournal(f *testing.F) {
	ps := resumePackets(40)
	dir := f.TempDir()
	file, err := os.Create(dir + "/j.strap")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	w, err := New(file, nil)
	if err != nil {
		f.Fatal(err)
	}
	var recs []JournalRecord
	start, indexed := int64(0), 0
	for i := range ps {
		if err := w.WritePacket(&ps[i]); err != nil {
			f.Fatal(err)
		}
		if (i+1)%7 == 0 {
			lo, lc := w.LastPacket()
			if start == 0 {
				start = 64 // the first record starts with the first packet
			}
			recs = append(recs, JournalRecord{Start: start, End: w.Offset(), Packets: w.Packets(), Drops: w.Drops(), Tokens: w.Tokens(),
				LastSeq: w.LastSeq(), LastOffset: lo, LastCRC: lc, Entries: w.IndexFrom(indexed)})
			start, indexed = w.Offset(), w.IndexLen()
		}
	}
	b := encodeJournal(recs)
	f.Add(b)
	f.Add(b[:len(b)-5])
	f.Add(EncodeJournalRecord(JournalRecord{Start: 64, End: 64}))
	f.Add([]byte(journalMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := ParseJournal(data)
		if err != nil {
			if !errors.Is(err, ErrBadJournal) {
				t.Fatalf("error %v is not ErrBadJournal", err)
			}
			return
		}
		if j.Valid+j.Torn != int64(len(data)) {
			t.Fatalf("valid %d + torn %d != %d bytes", j.Valid, j.Torn, len(data))
		}
		if again := encodeJournal(j.Records); !bytes.Equal(again, data[:j.Valid]) {
			t.Fatal("the parsed records encode to other bytes")
		}
		n := 0
		for _, r := range j.Records {
			n += len(r.Entries)
		}
		if n != len(j.Entries) {
			t.Fatalf("%d entries in the records, %d in the journal", n, len(j.Entries))
		}
	})
}
