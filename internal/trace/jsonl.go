package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// WriterOptions configures a Writer.
type WriterOptions struct {
	// FlushEvery is how many snapshots are buffered before one write(2) of all their
	// lines; 0 or 1 writes each snapshot as it comes.
	FlushEvery int
	// Fsync calls fsync after every flush (only when the destination is an *os.File).
	Fsync bool
}

// Writer writes Snapshots as JSON lines. Every flush is one write(2) of whole lines, so a
// process killed between writes leaves only whole lines; a write cut by a crash leaves at
// most one torn last line, which OpenFile (and RepairFile) detect and truncate before
// appending, and ReadSnapshots reports as ErrTornLine. Not safe for concurrent use.
type Writer struct {
	w       io.Writer
	f       *os.File
	opts    WriterOptions
	buf     []byte
	pending int
	closed  bool
	owned   bool // from OpenFile: Close closes f
}

// NewWriter returns a Writer appending to w (a file, a pipe, or a client-passed fd
// wrapped with os.NewFile). The caller keeps ownership of w; Close only flushes. It does
// not repair w: call RepairFile first on a file that may hold a crashed run's tail (the
// descriptor must be readable), or hand over a fresh file.
func NewWriter(w io.Writer, opts WriterOptions) *Writer {
	wr := &Writer{w: w, opts: opts}
	if f, ok := w.(*os.File); ok {
		wr.f = f
	}
	return wr
}

// OpenFile opens (creating if needed) a trace file for appending, first truncating a torn
// last line left by a crash. The returned Writer owns the file and closes it.
func OpenFile(path string, opts WriterOptions) (*Writer, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("open trace: %w", err)
	}
	cut, err := RepairFile(f)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	w := NewWriter(f, opts)
	w.owned = true
	return w, cut, nil
}

// tailWindow is how far back RepairFile looks for the last newline; a snapshot line is a
// few KiB, so a torn one is always inside it.
const tailWindow = 4 << 20

// linePrefix starts every line the Writer writes (Snapshot's first field).
var linePrefix = []byte(`{"timestamp":`)

// RepairFile prepares a trace file for appending after a crash. It cuts the bytes after
// the last newline (a line torn by a kill, or the zero-filled tail an unclean shutdown
// can leave), and then a last line that contains NULs or is not valid JSON. It refuses,
// with ErrNotTrace and without touching the file, when what it would cut does not look
// like a torn snapshot line. It returns how many bytes it cut.
func RepairFile(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat trace: %w", err)
	}
	size := st.Size()
	if size == 0 {
		return 0, nil
	}
	start := max(size-tailWindow, 0)
	tail := make([]byte, size-start)
	if _, err := f.ReadAt(tail, start); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read trace tail: %w", err)
	}
	keep := bytes.LastIndexByte(tail, '\n') + 1
	if keep == 0 && start > 0 {
		return 0, fmt.Errorf("repair trace: %w: no newline in the last %d bytes", ErrNotTrace, tailWindow)
	}
	if !tornLine(tail[keep:]) {
		return 0, fmt.Errorf("repair trace: %w: unexpected bytes after the last line", ErrNotTrace)
	}
	if keep > 0 {
		// The last whole line may still be damaged (zeros followed by a later newline).
		i := bytes.LastIndexByte(tail[:keep-1], '\n')
		line := tail[i+1 : keep-1]
		if bytes.IndexByte(line, 0) >= 0 || !json.Valid(line) {
			if !tornLine(line) {
				return 0, fmt.Errorf("repair trace: %w: last line is not a snapshot", ErrNotTrace)
			}
			keep = i + 1
		}
	}
	cut := int64(len(tail) - keep)
	if cut == 0 {
		return 0, nil
	}
	if err := f.Truncate(start + int64(keep)); err != nil {
		return 0, fmt.Errorf("truncate torn trace line: %w", err)
	}
	return cut, nil
}

// tornLine reports whether b can be what a cut write of a snapshot line left: empty, a
// prefix of a line as written (NULs allowed where data never reached the disk), or NULs.
func tornLine(b []byte) bool {
	b = bytes.TrimLeft(b, "\x00")
	if len(b) == 0 {
		return true
	}
	n := min(len(b), len(linePrefix))
	return bytes.Equal(b[:n], linePrefix[:n])
}

// Write encodes s as one line and writes it, or buffers it until FlushEvery lines.
func (w *Writer) Write(s Snapshot) error {
	if w.closed {
		return ErrClosed
	}
	b, err := jsonLine(s)
	if err != nil {
		return err
	}
	w.buf = append(w.buf, b...)
	w.pending++
	if w.pending >= max(w.opts.FlushEvery, 1) {
		return w.Flush()
	}
	return nil
}

// Flush writes the buffered lines in one write(2) and fsyncs when asked to. On error the
// lines stay buffered for the next try.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	n, err := w.w.Write(w.buf)
	if err != nil {
		// Drop what did get out so a retry does not duplicate it.
		w.buf = w.buf[:copy(w.buf, w.buf[n:])]
		return fmt.Errorf("write trace: %w", err)
	}
	w.buf = w.buf[:0]
	w.pending = 0
	if w.opts.Fsync && w.f != nil {
		if err := w.f.Sync(); err != nil {
			return fmt.Errorf("fsync trace: %w", err)
		}
	}
	return nil
}

// Close flushes and, for a Writer from OpenFile, closes the file.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	err := w.Flush()
	if w.owned && w.f != nil {
		err = errors.Join(err, w.f.Close())
	}
	return err
}

// ReadSnapshots parses a trace stream. A last line without its newline is reported as
// ErrTornLine together with the whole lines before it; any other bad line is an error
// naming its number.
func ReadSnapshots(r io.Reader) ([]Snapshot, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Snapshot
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				return out, fmt.Errorf("line %d: %w (%d bytes)", n, ErrTornLine, len(line))
			}
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("read trace: %w", err)
		}
		var s Snapshot
		if err := json.Unmarshal(line, &s); err != nil {
			return out, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, s)
	}
}

// jsonLine encodes s as one trace line with its newline.
func jsonLine(s Snapshot) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	return append(b, '\n'), nil
}
