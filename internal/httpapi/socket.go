package httpapi

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// removeStaleSocket removes a socket nobody answers on; anything else at path is left
// alone and reported.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("api socket %s: exists and is not a socket", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("api socket: remove stale: %w", err)
	}
	return nil
}

// listenPrivate binds under a umask that leaves only the owner, so nobody connects before
// the socket gets its mode and group.
func listenPrivate(path string) (*net.UnixListener, error) {
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	return ln, nil
}

func lchown(path string, gid int) error { return os.Lchown(path, -1, gid) }

func chmod(path string, mode uint32) error { return os.Chmod(path, os.FileMode(mode).Perm()) }
