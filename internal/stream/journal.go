package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The index journal keeps the INDEX entries of a stream's packets outside the stream, for
// a stream whose prefix was freed after its upload (a hole punched behind it,
// docs/OBJECT_STORAGE.md "Freeing the local disk"): a resume cannot walk packets that are
// no longer on the disk, so it takes their entries from here and walks only the rest.
//
// The journal is a sequence of records, each appended and fsynced before any byte it
// describes is freed. A record covers the packets that start in [Start, End); End is a
// packet boundary (a checkpoint's offset), the next record starts there. Its counters are
// the stream's totals at End, so the record where a resume starts its live walk says what
// the walked part must continue from. Record layout (little-endian):
//
//	0   magic "SIJR"
//	4   version u16 (1), reserved u16 (0)
//	8   start, end u64
//	24  packets, drops, tokens u64 (totals at end)
//	48  last_seq u64, last_offset u64 (the last packet before end; 0 when none)
//	64  last_crc u32 (its CRC32C field), payload_len u32
//	72  payload: the INDEX payload encoding (docs/STREAM_FORMAT.md 3) of the record's entries
//	..  crc32c u32 over everything before it
const (
	journalMagic     = "SIJR"
	journalVersion   = 1
	journalHeaderLen = 72
	// maxJournalPayload bounds one record: far more than the packets between two
	// checkpoints of any capture (40 bytes an entry).
	maxJournalPayload = 256 << 20
)

// ErrBadJournal is returned for journal bytes that are not a valid journal.
var ErrBadJournal = errors.New("bad index journal")

// JournalRecord is one record: the entries of the packets in [Start, End) and the
// stream's totals at End.
type JournalRecord struct {
	Start, End             int64
	Packets, Drops, Tokens uint64
	LastSeq                uint64
	LastOffset             int64
	LastCRC                uint32
	Entries                []IndexEntry
	// size is the record's length in the journal file (ParseJournal).
	size int64
}

// Journal is a parsed journal.
type Journal struct {
	// Records are the valid records in order, Entries all their entries.
	Records []JournalRecord
	Entries []IndexEntry
	// Valid is the length of the valid records; Torn the bytes after them that do not
	// form a whole record (an append cut short by a crash: nothing was freed on it).
	Valid, Torn int64
}

// End is where the journal's last record ends (0: no record).
func (j *Journal) End() int64 {
	if len(j.Records) == 0 {
		return 0
	}
	return j.Records[len(j.Records)-1].End
}

// Upto is the journal cut at its last record that ends at or before off: the entries of
// the packets before that end and the record (ok false: no record ends there).
func (j *Journal) Upto(off int64) (entries []IndexEntry, rec JournalRecord, ok bool) {
	for _, r := range j.Records {
		if r.End > off {
			break
		}
		rec, ok = r, true
	}
	if !ok {
		return nil, rec, false
	}
	k := 0
	for k < len(j.Entries) && j.Entries[k].Offset < rec.End {
		k++
	}
	return j.Entries[:k], rec, true
}

// BytesUpto is the length of the journal's records that end at or before off (to cut the
// file back to them).
func (j *Journal) BytesUpto(off int64) int64 {
	var n int64
	for _, r := range j.Records {
		if r.End > off {
			break
		}
		n += r.size
	}
	return n
}

// indexPayloadOf encodes entries as an INDEX payload with its own name table.
func indexPayloadOf(entries []IndexEntry) []byte {
	ids := map[string]uint32{}
	var names []string
	index := make([]indexEntry, len(entries))
	for i, e := range entries {
		id, ok := ids[e.Name]
		if !ok {
			id = uint32(len(names))
			ids[e.Name] = id
			names = append(names, e.Name)
		}
		index[i] = indexEntry{nameIdx: id, typ: e.Type, flags: uint16(e.Flags), seq: e.Seq, step: e.Step,
			forward: e.Forward, offset: uint64(e.Offset)}
	}
	return encodeIndexPayload(names, index)
}

// EncodeJournalRecord is r's bytes, to append to a journal.
func EncodeJournalRecord(r JournalRecord) []byte {
	payload := indexPayloadOf(r.Entries)
	le := binary.LittleEndian
	b := make([]byte, 0, journalHeaderLen+len(payload)+4)
	b = append(b, journalMagic...)
	b = le.AppendUint16(b, journalVersion)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint64(b, uint64(r.Start))
	b = le.AppendUint64(b, uint64(r.End))
	b = le.AppendUint64(b, r.Packets)
	b = le.AppendUint64(b, r.Drops)
	b = le.AppendUint64(b, r.Tokens)
	b = le.AppendUint64(b, r.LastSeq)
	b = le.AppendUint64(b, uint64(r.LastOffset))
	b = le.AppendUint32(b, r.LastCRC)
	b = le.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// ParseJournal reads a journal file's bytes and checks every record against the ones
// before it: contiguous ranges, entries in order inside their record's range, sequence
// numbers rising, totals that add up, TOKEN steps numbered on. A last record cut short (or
// whose checksum fails where it ends the file) is a torn append and reported in Torn;
// anything else that does not check out is ErrBadJournal.
func ParseJournal(b []byte) (*Journal, error) {
	le := binary.LittleEndian
	j := &Journal{}
	var prev JournalRecord
	var off int64
	for int64(len(b)) > off {
		rest := b[off:]
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: record at byte %d: %s", ErrBadJournal, off, fmt.Sprintf(format, args...))
		}
		if len(rest) < journalHeaderLen {
			j.Torn = int64(len(rest))
			break
		}
		if string(rest[:4]) != journalMagic {
			return nil, bad("magic %q", rest[:4])
		}
		if v := le.Uint16(rest[4:]); v != journalVersion || le.Uint16(rest[6:]) != 0 {
			return nil, bad("version %d", v)
		}
		plen := int64(le.Uint32(rest[68:]))
		if plen > maxJournalPayload {
			return nil, bad("payload of %d bytes", plen)
		}
		n := journalHeaderLen + plen + 4
		if int64(len(rest)) < n {
			j.Torn = int64(len(rest))
			break
		}
		if got, want := crc32.Checksum(rest[:n-4], castagnoli), le.Uint32(rest[n-4:]); got != want {
			if int64(len(rest)) == n {
				j.Torn = n // the last append, cut short in its content
				break
			}
			return nil, bad("crc32c %#08x, stored %#08x", got, want)
		}
		r := JournalRecord{Start: int64(le.Uint64(rest[8:])), End: int64(le.Uint64(rest[16:])),
			Packets: le.Uint64(rest[24:]), Drops: le.Uint64(rest[32:]), Tokens: le.Uint64(rest[40:]),
			LastSeq: le.Uint64(rest[48:]), LastOffset: int64(le.Uint64(rest[56:])), LastCRC: le.Uint32(rest[64:])}
		entries, err := parseIndex(rest[journalHeaderLen:n-4], off)
		if err != nil {
			return nil, bad("%v", err)
		}
		r.Entries, r.size = entries, n
		if err := checkRecord(r, prev, len(j.Records) == 0); err != nil {
			return nil, bad("%v", err)
		}
		j.Records = append(j.Records, r)
		j.Entries = append(j.Entries, entries...)
		prev = r
		off += n
	}
	j.Valid = off
	return j, nil
}

// checkRecord checks r against the record before it (first: there is none).
func checkRecord(r, prev JournalRecord, first bool) error {
	if r.Start < 0 || r.End < r.Start || r.End > 1<<62 {
		return fmt.Errorf("range [%d, %d)", r.Start, r.End)
	}
	if !first && r.Start != prev.End {
		return fmt.Errorf("starts at %d, the record before ends at %d", r.Start, prev.End)
	}
	packets, drops, tokens := prev.Packets, prev.Drops, prev.Tokens
	lastSeq, lastOff, lastCRC := prev.LastSeq, prev.LastOffset, prev.LastCRC
	if first {
		packets, drops, tokens, lastSeq, lastOff, lastCRC = 0, 0, 0, 0, 0, 0
	}
	for i, e := range r.Entries {
		if e.Offset < r.Start || e.Offset >= r.End {
			return fmt.Errorf("entry %d at offset %d outside [%d, %d)", i, e.Offset, r.Start, r.End)
		}
		if packets > 0 && (e.Offset <= lastOff || e.Seq <= lastSeq) {
			return fmt.Errorf("entry %d (offset %d, seq %d) not after the one before (offset %d, seq %d)", i, e.Offset, e.Seq, lastOff, lastSeq)
		}
		switch e.Type {
		case TypeDrop:
			drops++
		case TypeToken:
			if e.Step != tokens {
				return fmt.Errorf("entry %d: TOKEN of step %d, expected %d", i, e.Step, tokens)
			}
			tokens++
		}
		packets++
		lastSeq, lastOff = e.Seq, e.Offset
	}
	if len(r.Entries) > 0 {
		// The CRC of the last packet is the record's own: entries do not carry CRCs.
		lastCRC = r.LastCRC
	}
	if r.Packets != packets || r.Drops != drops || r.Tokens != tokens {
		return fmt.Errorf("totals %d packets, %d drops, %d tokens; the entries make %d, %d, %d", r.Packets, r.Drops, r.Tokens, packets, drops, tokens)
	}
	if r.LastSeq != lastSeq || r.LastOffset != lastOff || r.LastCRC != lastCRC {
		return fmt.Errorf("last packet seq %d at %d (crc %#08x); the entries make seq %d at %d (crc %#08x)", r.LastSeq, r.LastOffset, r.LastCRC, lastSeq, lastOff, lastCRC)
	}
	if packets > 0 && lastOff >= r.End {
		return fmt.Errorf("last packet at %d, not before the end %d", lastOff, r.End)
	}
	return nil
}
