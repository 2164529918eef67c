package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// ErrBadProcIO is returned for /proc/<pid>/io content without its read_bytes and
// write_bytes lines.
var ErrBadProcIO = errors.New("malformed /proc/<pid>/io")

// parseProcIO returns the read_bytes and write_bytes of a /proc/<pid>/io file ("name:
// value" lines).
func parseProcIO(b []byte) (read, write uint64, err error) {
	var haveR, haveW bool
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		k, v, ok := bytes.Cut(line, []byte(": "))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(k) {
		case "read_bytes":
			dst, haveR = &read, true
		case "write_bytes":
			dst, haveW = &write, true
		default:
			continue
		}
		n, perr := strconv.ParseUint(string(v), 10, 64)
		if perr != nil {
			return 0, 0, fmt.Errorf("%w: %s: %q", ErrBadProcIO, k, clip(v))
		}
		*dst = n
	}
	if !haveR || !haveW {
		return 0, 0, fmt.Errorf("%w: no read_bytes or write_bytes line", ErrBadProcIO)
	}
	return read, write, nil
}

// procIO reads /proc/<pid>/io through a descriptor kept open between calls (read at every
// TOKEN: one pread instead of an open, a read and a close). The descriptor stays bound to
// the process it was opened for: once that exits, reads fail (ESRCH) rather than read a
// later process with the same pid.
type procIO struct {
	root  string
	files map[int]*os.File
	buf   []byte
}

func (p *procIO) read(pid int) (read, write uint64, err error) {
	f := p.files[pid]
	if f == nil {
		if f, err = os.Open(filepath.Join(p.root, strconv.Itoa(pid), "io")); err != nil {
			return 0, 0, err
		}
		if p.files == nil {
			p.files = map[int]*os.File{}
		}
		p.files[pid] = f
	}
	if p.buf == nil {
		p.buf = make([]byte, 512)
	}
	n, err := f.ReadAt(p.buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, 0, fmt.Errorf("proc %d io: %w", pid, err)
	}
	read, write, err = parseProcIO(p.buf[:n])
	if err != nil {
		return 0, 0, fmt.Errorf("proc %d io: %w", pid, err)
	}
	return read, write, nil
}

// forget closes pid's descriptor (pid < 0: every one).
func (p *procIO) forget(pid int) {
	for k, f := range p.files {
		if pid < 0 || k == pid {
			f.Close()
			delete(p.files, k)
		}
	}
}
