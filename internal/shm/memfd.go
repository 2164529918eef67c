package shm

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// RequiredSeals are the seals a ring memfd must carry: without them a client could shrink
// the file under the daemon's mapping and kill it with SIGBUS.
const RequiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// Ring is a client's ring memfd mapped read-only into the daemon.
type Ring struct {
	mem      []byte
	dataSize uint64
}

// CheckMemfd verifies that fd is a regular file supporting seals, carries RequiredSeals and
// is exactly ringSize bytes long.
func CheckMemfd(fd int, ringSize uint64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat ring: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: file type %#o, expected a regular file (memfd)", ErrNotMemfd, st.Mode&unix.S_IFMT)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%w: F_GET_SEALS not supported (not created by memfd_create with MFD_ALLOW_SEALING)", ErrNotMemfd)
		}
		return fmt.Errorf("get seals: %w", err)
	}
	if seals&RequiredSeals != RequiredSeals {
		return fmt.Errorf("%w: seals %#x, expected at least F_SEAL_SHRINK|F_SEAL_GROW (%#x)", ErrNotSealed, seals, RequiredSeals)
	}
	if err := CheckRingSize(ringSize); err != nil {
		return err
	}
	if uint64(st.Size) != ringSize {
		return fmt.Errorf("%w: memfd is %d bytes, OPEN declared ring_size %d", ErrRingSize, st.Size, ringSize)
	}
	return nil
}

// Map validates fd with CheckMemfd, maps it MAP_SHARED read-only and checks its header.
// The caller keeps ownership of fd (the mapping stays valid after fd is closed).
func Map(fd int, ringSize uint64) (*Ring, error) {
	if err := CheckMemfd(fd, ringSize); err != nil {
		return nil, err
	}
	if ringSize > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("%w: %d bytes cannot be mapped", ErrRingSize, ringSize)
	}
	mem, err := unix.Mmap(fd, 0, int(ringSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map ring: %w", err)
	}
	ds, err := ParseHeader(mem, ringSize)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	return &Ring{mem: mem, dataSize: ds}, nil
}

// Size is the whole ring's size in bytes (header included).
func (r *Ring) Size() uint64 { return uint64(len(r.mem)) }

// DataSize is the size of the data region.
func (r *Ring) DataSize() uint64 { return r.dataSize }

// Data is the data region of the mapping. Its bytes change under the reader whenever the
// client writes: only read ranges the client has published and not yet been released.
func (r *Ring) Data() []byte { return r.mem[HeaderSize:] }

// Close unmaps the ring. No slice obtained from it may be used afterwards.
func (r *Ring) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	if err != nil {
		return fmt.Errorf("unmap ring: %w", err)
	}
	return nil
}
