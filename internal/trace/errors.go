package trace

import "errors"

// Sentinel errors returned by this package.
var (
	// ErrClosed is returned by Write on a closed Writer.
	ErrClosed = errors.New("trace: writer closed")
	// ErrTornLine is reported by ReadSnapshots for a final line without its newline (a
	// write cut short by a crash); the whole lines before it are returned.
	ErrTornLine = errors.New("trace: torn last line")
	// ErrNotTrace is returned by RepairFile (and OpenFile) for a file whose tail is not a
	// trace written by this package; the file is left untouched.
	ErrNotTrace = errors.New("trace: not a trace file")
	// ErrBadSpan is returned by ParseSpanLine for a line that is not a span event.
	ErrBadSpan = errors.New("trace: malformed span line")
)
