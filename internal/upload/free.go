package upload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/stream"
)

// Freeing the local disk behind the upload (Options.FreeLocal, docs/OBJECT_STORAGE.md
// "Freeing the local disk"): while a capture goes on, the stream's bytes that the server
// acknowledged are punched out of the local file (fallocate PUNCH_HOLE, the file keeps its
// size), so the disk holds roughly the upload's lag, a part or two and the bytes since the
// last-but-one checkpoint. What may be freed:
//
//   - only whole parts the server acknowledged (their CRC32C checked by it) and the state
//     file recorded, and only parts that end at or before the offset of the last-but-one
//     CHECKPOINT of the session: a client killed between strapd's CHECKPOINTED and its
//     own checkpoint file still has the checkpoint before on disk, and a resume keeps at
//     least the prefix that one describes, so every part holding a freed byte stays
//     wholly inside the resumed prefix (kept, never sent again);
//   - never the file header, nor the checkpoint's last packet (a resume checks both);
//   - only after the index entries of every packet up to the checkpoint are in the index
//     journal (stream.JournalRecord, fsynced), from which a resumed session takes the
//     freed packets' entries.
//
// strapd learns the checkpoints from the CHECKPOINT messages it answers, not from the
// checkpoint file: each reaches it at once and exact, with no file to poll or parse during
// the capture, and a client may keep its checkpoint anywhere (checkpoint_path).

// freeAlign is the granularity of freeing: file systems punch whole blocks.
const freeAlign = 4096

// Checkpoint is what a session's CHECKPOINT made durable, as freeing needs it.
type Checkpoint struct {
	// Offset is the stream's size at the checkpoint (a packet boundary).
	Offset int64
	// Packets, Drops, Tokens are the stream's totals there; LastSeq, LastOffset and
	// LastCRC its last packet's.
	Packets, Drops, Tokens uint64
	LastSeq                uint64
	LastOffset             int64
	LastCRC                uint32
	// Index are the entries of the packets written since the previous checkpoint (all of
	// the stream's, for a session's first; entries the journal already has are skipped).
	Index []stream.IndexEntry
}

// LostError is an upload that cannot be completed: bytes freed on the local disk are not
// (or no longer) on the server. It is final: nothing can send them again.
type LostError struct {
	Object   string
	From, To int64
	Why      string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("%s: stream bytes [%d, %d) are lost: %s, and their local copy was freed (--upload-free-local); the object cannot be completed", e.Object, e.From, e.To, e.Why)
}

// Range is the lost byte range as status shows it.
func (e *LostError) Range() string { return fmt.Sprintf("[%d, %d)", e.From, e.To) }

// lost is the LostError for bytes from `from` on, up to what was freed, or nil when none
// of them were freed (they can be sent again from the local file).
func (u *Upload) lost(from int64, why string) error {
	st := u.st
	if st.FreedTo <= st.FreedFrom || from >= st.FreedTo {
		return nil
	}
	return &LostError{Object: u.object(), From: max(from, st.FreedFrom), To: st.FreedTo, Why: why}
}

// Checkpointed records a session checkpoint for freeing. Called from the session's writer
// goroutine (pipeline.Env.OnCheckpoint): it never blocks.
func (u *Upload) Checkpointed(c Checkpoint) {
	if !u.freeLocal {
		return
	}
	u.mu.Lock()
	if u.freeStopped {
		u.mu.Unlock()
		return // nothing more is freed: nothing to journal
	}
	u.pending = append(u.pending, c)
	u.pendingEntries += len(c.Index)
	u.ckpts = append(u.ckpts, c.Offset)
	if len(u.ckpts) > 2 {
		u.ckpts = u.ckpts[len(u.ckpts)-2:]
	}
	u.lastOffs = append(u.lastOffs, c.LastOffset)
	if len(u.lastOffs) > 2 {
		u.lastOffs = u.lastOffs[len(u.lastOffs)-2:]
	}
	u.mu.Unlock()
	u.wakeUp()
}

// journalPath is the index journal's path beside the state file.
func (m *Manager) journalPath(st *State) string {
	return filepath.Join(m.o.StateDir, fmt.Sprintf("upload-%d-%d.index", st.Dev, st.Ino))
}

// loadJournal reads the stream's index journal, cut back to its records that end at or
// before off (a resume at off: later records describe bytes the resume cuts), and
// truncates the file to them.
func (m *Manager) loadJournal(st *State, off int64) (*stream.Journal, error) {
	p := m.journalPath(st)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("index journal: %w", err)
	}
	j, err := stream.ParseJournal(b)
	if err != nil {
		return nil, fmt.Errorf("index journal %s: %w", p, err)
	}
	keep := j.BytesUpto(off)
	if keep != int64(len(b)) {
		// Synced: records past the resume point describe bytes the resumed session
		// rewrites (were they back after a crash, the next record would not follow on
		// from them and the journal would be refused, never misread).
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			err = f.Truncate(keep)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cut the index journal back to %d: %w", off, err)
		}
		if j, err = stream.ParseJournal(b[:keep]); err != nil {
			return nil, err
		}
	}
	return j, nil
}

// FreesLocal says whether this upload frees the stream's uploaded bytes (Options.FreeLocal
// or Stream.FreeLocal): the session then reports its checkpoints with their index entries.
func (u *Upload) FreesLocal() bool { return u.freeLocal }

// Journal is the index journal of the stream's freed prefix, for its resume
// (stream.ResumeExpect.Journal); nil when nothing of the stream was freed.
func (u *Upload) Journal() *stream.Journal { return u.journal }

// stopFreeing turns freeing off for this upload with why, once: the capture and the upload
// go on, nothing more is freed.
func (u *Upload) stopFreeing(why string) {
	if u.noFree {
		return
	}
	u.noFree = true
	u.mu.Lock()
	u.freeStopped, u.pending, u.pendingEntries = true, nil, 0
	u.mu.Unlock()
	u.m.o.Log.Warn("local disk not freed behind the upload; the capture goes on and keeps every byte from here",
		zap.String("object", u.object()), zap.String("reason", why))
	u.setStatus(func(s *Status) { s.FreeError = why })
	u.closePunch()
}

func (u *Upload) closePunch() {
	u.punchMu.Lock()
	if u.punch != nil {
		u.punch.Close()
		u.punch = nil
	}
	u.punchMu.Unlock()
}

// maxPendingEntries bounds the index entries held for the journal between two punches
// (an outage stops the punches, not the checkpoints).
const maxPendingEntries = 1 << 16

// freeReady reports whether this upload frees its stream now, reading where the stream's
// header ends the first time.
func (u *Upload) freeReady() bool {
	if !u.freeLocal || u.noFree || u.st.FinalSize >= 0 || len(u.st.Copy) > 0 {
		return false
	}
	u.punchMu.Lock()
	has := u.punch != nil
	u.punchMu.Unlock()
	if !has {
		return false
	}
	if u.dataOff == 0 {
		r, err := stream.NewReader(u.f, u.durable.Load())
		if err != nil {
			return false // the header is not durable yet
		}
		u.hdrEnd = r.Header().DataOffset
		u.dataOff = (u.hdrEnd + freeAlign - 1) &^ (freeAlign - 1)
	}
	return true
}

// flushJournal writes the checkpoints' index entries not yet in the journal (fsynced). It
// runs before each punch, and at any step once maxPendingEntries wait (flushJournalIfLarge).
// It reports whether freeing may go on.
func (u *Upload) flushJournal() bool {
	if !u.freeReady() {
		return false
	}
	if err := u.writeJournal(); err != nil {
		u.stopFreeing(fmt.Sprintf("write the index journal: %v", err))
		return false
	}
	return true
}

// flushJournalIfLarge writes the journal when many entries wait: the journal is fsynced
// only before a punch otherwise (one per few parts rather than one per checkpoint).
func (u *Upload) flushJournalIfLarge() {
	u.mu.Lock()
	n := u.pendingEntries
	u.mu.Unlock()
	if n >= maxPendingEntries {
		u.flushJournal()
	}
}

// freeBehind frees what may be freed now, the index journal written first.
func (u *Upload) freeBehind() {
	if !u.freeReady() {
		return
	}
	st := u.st
	u.mu.Lock()
	var ckpt, lastOff int64 = -1, -1
	if len(u.ckpts) == 2 {
		ckpt, lastOff = u.ckpts[0], u.lastOffs[0]
	}
	u.mu.Unlock()
	if ckpt < 0 {
		return
	}
	// Whole acknowledged parts that end by the last-but-one checkpoint, and not its last
	// packet (a resume reads it).
	var end int64
	for _, p := range st.Parts {
		e := partStart(st.PartSize, p.Number) + p.Size
		if e > ckpt {
			break
		}
		end = e
	}
	to := min(end, lastOff) &^ (freeAlign - 1)
	from := max(st.FreedTo, u.dataOff)
	if to <= from {
		return
	}
	// The journal covers every packet up to the checkpoint before a byte below it goes.
	if !u.flushJournal() || ckpt > u.journalEnd {
		return
	}
	oldFrom, oldTo := st.FreedFrom, st.FreedTo
	if st.FreedFrom == 0 {
		st.FreedFrom = u.dataOff
	}
	st.FreedTo = to
	// Recorded before the hole is punched: a crash between leaves a state that names a
	// range perhaps not yet freed, never a freed range it does not name.
	if err := u.save(); err != nil {
		st.FreedFrom, st.FreedTo = oldFrom, oldTo
		u.stopFreeing(fmt.Sprintf("record the freed range in the upload state: %v", err))
		return
	}
	u.punchMu.Lock()
	var err error
	ended := u.punch == nil
	if ended {
		err = errors.New("the session ended")
	} else {
		err = punchHole(u.punch, from, to-from)
	}
	u.punchMu.Unlock()
	if err != nil {
		unsupported := errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
		if unsupported || ended {
			// Nothing was freed: the state goes back to what is true.
			st.FreedFrom, st.FreedTo = oldFrom, oldTo
			if serr := u.save(); serr != nil {
				u.m.o.Log.Warn("record the upload state", zap.Error(serr))
			}
		}
		switch {
		case unsupported:
			u.stopFreeing(fmt.Sprintf("the file system of %s cannot free parts of a file (fallocate PUNCH_HOLE: %v)", st.Path, err))
		case !ended:
			// Perhaps partly freed: the state keeps naming the range (those parts are
			// never sent again from the file).
			u.stopFreeing(fmt.Sprintf("free [%d, %d) of %s: %v", from, to, st.Path, err))
		}
		return
	}
	freed := st.FreedTo - st.FreedFrom
	u.m.freed.Add(uint64(to - from))
	u.setStatus(func(s *Status) { s.FreedBytes = freed })
}

// punchHole frees [off, off+n) of f's blocks; the file keeps its size and reads zeros there.
var punchHole = func(f *os.File, off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != unix.EINTR {
			return err
		}
	}
}

// writeJournal appends a record for each checkpoint not yet journaled and fsyncs it.
func (u *Upload) writeJournal() error {
	u.mu.Lock()
	pend := u.pending
	u.pending, u.pendingEntries = nil, 0
	u.mu.Unlock()
	var buf []byte
	end := u.journalEnd
	for _, c := range pend {
		if c.Offset <= end {
			continue
		}
		start := end
		if start == 0 {
			start = u.hdrEnd // the first record starts with the first packet
		}
		var entries []stream.IndexEntry
		for _, e := range c.Index {
			if e.Offset >= start {
				entries = append(entries, e)
			}
		}
		buf = append(buf, stream.EncodeJournalRecord(stream.JournalRecord{Start: start, End: c.Offset, Packets: c.Packets,
			Drops: c.Drops, Tokens: c.Tokens, LastSeq: c.LastSeq, LastOffset: c.LastOffset, LastCRC: c.LastCRC, Entries: entries})...)
		end = c.Offset
	}
	if len(buf) == 0 {
		return nil
	}
	p := u.m.journalPath(u.st)
	_, statErr := os.Stat(p)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(buf)
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && statErr != nil {
		err = syncDir(u.m.o.StateDir)
	}
	if err != nil {
		return err
	}
	u.journalEnd = end
	return nil
}
