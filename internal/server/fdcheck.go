package server

import (
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
)

// checkWritableFile is the one check of a descriptor a client passes for strapd to write
// into (the output, the trace, the resource log): a regular file (not a pipe, socket or
// device, whose writes could block the daemon or mean something else) open for writing.
// It returns the descriptor's status flags for the caller's own rules. what names the
// descriptor in the errors; how says how the client should open it.
func checkWritableFile(fd int, what, how string) (flags int, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, perr(control.CodeBadOutput, "fstat %s: %v", what, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, perr(control.CodeBadOutput, "%s is file type %#o, expected a regular file", what, st.Mode&unix.S_IFMT)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return 0, perr(control.CodeBadOutput, "%s flags: %v", what, err)
	}
	if acc := fl & unix.O_ACCMODE; acc != unix.O_WRONLY && acc != unix.O_RDWR {
		return 0, perr(control.CodeBadOutput, "%s is not open for writing (%s)", what, how)
	}
	return fl, nil
}
