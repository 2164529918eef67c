package stream

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Direct I/O (docs/STREAM_FORMAT.md 6): the page-cache copy of every buffered write was
// three quarters of the daemon's CPU on codec none. With O_DIRECT the bytes go from a
// staging buffer to the device by DMA; the one copy left is ours, from the ring into the
// staging buffer, and it lets the CRC be computed over bytes the client cannot touch.
const (
	// dirAlign is the file offset, length and memory alignment of every O_DIRECT write:
	// a page, which covers devices with 512-byte and 4 KiB logical blocks.
	dirAlign = 4096
	// dirBufSize is one staging buffer. A packet that fits in one is copied in and
	// CRC-checked over the copy, once. Tensors come in powers of two: the 256 KiB over
	// 8 MiB lets an 8 MiB tensor, or two of 4 MiB, fit with their headers (and makes the
	// writes twice as large as one 4 MiB packet each).
	dirBufSize = 8<<20 + 256<<10
	// dirBufs staging buffers at most per stream: one being filled, the others being
	// written by the I/O goroutine, so copying and the device overlap.
	dirBufs = 3
	// crcChunk is how much is copied before the copy is CRC-checked, so the CRC reads
	// bytes still in cache.
	crcChunk = 256 << 10
)

// DirectStaging is the most memory one stream's direct writer holds in staging buffers;
// the daemon counts it in the session's memory budget.
const DirectStaging = dirBufs * dirBufSize

// dirJob is one aligned staging buffer to write at off. safe is the latest packet
// boundary at or before off: where the file is cut back to if this write fails.
type dirJob struct {
	buf  []byte
	off  int64
	safe int64
}

// direct stages a stream's bytes in aligned buffers and writes them with O_DIRECT from
// one goroutine, in file order. The Writer's goroutine fills; it never waits for the
// device unless every buffer is in flight, or at a sync.
type direct struct {
	rc    syscall.RawConn
	crcs  *RangeCRCs // the Writer's: CRCs taken over staged copies go into it
	stage []byte     // the buffer being filled; stage[0] is at file offset base
	base  int64      // a multiple of dirAlign
	// bounds are packet boundaries not yet behind every written job, ascending; bounds[0]
	// is the newest boundary at or before the last submitted job's offset.
	bounds []int64

	free    chan []byte
	todo    chan dirJob
	src     StagingSource // nil: buffers mapped for this stream, unmapped at stop
	owned   []StagingBuf  // every buffer taken, given back at stop
	pending sync.WaitGroup

	// refused is set once a write came back EINVAL although F_SETFL took O_DIRECT (a file
	// system that takes the flag but not the I/O): O_DIRECT is cleared and every write
	// from then on, that one again first, goes through the page cache.
	refused atomic.Bool

	mu      sync.Mutex
	err     error // first failed write; later jobs are not written
	errSafe int64
	stopped bool
}

// directUnsupported says why a file is written through the page cache, or "" when
// O_DIRECT may be tried. tmpfs accepts O_DIRECT (Linux 6.6+) but serves it by copying
// into its page cache, so there the staging copy would only be added.
func directUnsupported(rc syscall.RawConn) string {
	var st unix.Statfs_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstatfs(int(fd), &st) }); err != nil || serr != nil {
		return fmt.Sprintf("fstatfs: %v", errors.Join(err, serr))
	}
	switch st.Type {
	case unix.TMPFS_MAGIC, unix.RAMFS_MAGIC:
		return "tmpfs/ramfs: memory, O_DIRECT would copy into the page cache anyway"
	}
	return ""
}

// setDirect sets or clears O_DIRECT on the open file description.
func setDirect(rc syscall.RawConn, on bool) error {
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		var fl int
		if fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr != nil {
			return
		}
		if on {
			fl |= unix.O_DIRECT
		} else {
			fl &^= unix.O_DIRECT
		}
		_, ferr = unix.FcntlInt(fd, unix.F_SETFL, fl)
	}); err != nil {
		return err
	}
	return ferr
}

// fileFlags returns the file status flags (F_GETFL).
func fileFlags(rc syscall.RawConn) (int, error) {
	var fl int
	var ferr error
	if err := rc.Control(func(fd uintptr) { fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return 0, err
	}
	return fl, ferr
}

// enableDirect turns O_DIRECT on for the stream's file, whose next byte goes at off and
// whose bytes [alignDown(off), off) are head (the caller knows them: it wrote or read
// them), taking its staging buffers from src (nil: its own). It returns nil and the
// reason when the file is written through the page cache.
func enableDirect(rc syscall.RawConn, off int64, head []byte, src StagingSource) (*direct, string) {
	if why := directUnsupported(rc); why != "" {
		return nil, why
	}
	fl, err := fileFlags(rc)
	if err != nil {
		return nil, fmt.Sprintf("F_GETFL: %v", err)
	}
	if fl&unix.O_APPEND != 0 {
		// pwrite ignores the offset under O_APPEND, and the staging rewrites the last
		// partial block.
		return nil, "the file is open O_APPEND"
	}
	if err := setDirect(rc, true); err != nil {
		return nil, fmt.Sprintf("the file system refuses O_DIRECT: %v", err)
	}
	d := &direct{rc: rc, free: make(chan []byte, dirBufs), todo: make(chan dirJob, dirBufs), src: src}
	d.base = off &^ (dirAlign - 1)
	d.stage = append(d.getBuf(), head[len(head)-int(off-d.base):]...)
	d.bounds = []int64{off}
	go d.run()
	return d, ""
}

// StagingBufSize is the capacity of one staging buffer.
const StagingBufSize = dirBufSize

// StagingBuf is one staging buffer's memory: mapped outside the Go heap or, where
// mapping failed, from the heap. Only the daemon's own goroutines ever touch it; bytes
// of an earlier stream left in a reused one are never written (only what a stream
// staged is, and a partial block's padding is cleared first).
type StagingBuf struct {
	b      []byte
	mapped bool
}

// Mapped reports whether the buffer is a mapping (FreeStagingBuf unmaps it) rather than
// heap memory.
func (s StagingBuf) Mapped() bool { return s.mapped }

// StagingSource lends direct writers their staging buffers: Get returns one of capacity
// StagingBufSize (its contents are undefined), Put takes back one a writer no longer
// uses. The daemon keeps those of an ended stream for the next one: a fresh mapping
// costs the kernel zeroing every page on first touch, which for the 24.75 MiB of a
// stream's three buffers was a third of the daemon's CPU on a 48 MiB prefill capture
// (docs/PERFORMANCE.md).
type StagingSource interface {
	Get() StagingBuf
	Put(StagingBuf)
}

// NewStagingBuf maps an empty staging buffer of capacity StagingBufSize, outside the
// Go heap and backed by huge pages where the kernel allows: O_DIRECT pins the buffer's
// pages for every write, and a 2 MiB page pins as one.
func NewStagingBuf() StagingBuf {
	const huge = 2 << 20
	m, err := unix.MmapPtr(-1, 0, nil, dirBufSize+huge, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// The heap then: any page-aligned memory does for O_DIRECT.
		b := make([]byte, dirBufSize+dirAlign)
		a := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b)))) & (dirAlign - 1)
		return StagingBuf{b: b[a : a : a+dirBufSize]}
	}
	// Keep the 2 MiB-aligned dirBufSize bytes of the mapping, unmap the ends.
	lead := -uintptr(m) & (huge - 1)
	start := unsafe.Add(m, lead)
	if lead > 0 {
		_ = unix.MunmapPtr(m, lead)
	}
	if trail := huge - lead; trail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(start, dirBufSize), trail)
	}
	b := unsafe.Slice((*byte)(start), dirBufSize)
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advice only
	return StagingBuf{b: b[:0], mapped: true}
}

// FreeStagingBuf unmaps b (a heap buffer is left to the collector).
func FreeStagingBuf(b StagingBuf) {
	if b.mapped {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b.b)), uintptr(cap(b.b)))
	}
}

// getBuf returns an empty staging buffer, waiting for one to come back from the device
// when all are allocated.
func (d *direct) getBuf() []byte {
	select {
	case b := <-d.free:
		return b
	default:
	}
	if len(d.owned) < dirBufs {
		var b StagingBuf
		if d.src != nil {
			b = d.src.Get()
		} else {
			b = NewStagingBuf()
		}
		d.owned = append(d.owned, b)
		return b.b[:0]
	}
	return <-d.free
}

// run writes jobs in order until todo is closed. After a failure it keeps taking jobs
// (so the filler never blocks) without writing them.
func (d *direct) run() {
	for j := range d.todo {
		d.mu.Lock()
		failed := d.err != nil
		d.mu.Unlock()
		if !failed {
			if err := d.writeAt(j.buf, j.off); err != nil {
				d.mu.Lock()
				d.err, d.errSafe = err, j.safe
				d.mu.Unlock()
			}
		}
		d.free <- j.buf[:0]
		d.pending.Done()
	}
}

// writeAt is pwrite, falling back to the page cache for good when the file system
// fails an aligned O_DIRECT write with EINVAL (see refused).
func (d *direct) writeAt(b []byte, off int64) error {
	err := d.pwrite(b, off)
	if errors.Is(err, unix.EINVAL) && !d.refused.Load() && setDirect(d.rc, false) == nil {
		d.refused.Store(true)
		err = d.pwrite(b, off)
	}
	return err
}

// pwrite writes all of b at off, resuming after short writes and EINTR.
func (d *direct) pwrite(b []byte, off int64) error {
	for len(b) > 0 {
		var n int
		var werr error
		if err := d.rc.Control(func(fd uintptr) {
			for {
				n, werr = unix.Pwrite(int(fd), b, off)
				if werr != unix.EINTR {
					return
				}
			}
		}); err != nil {
			return err
		}
		if werr != nil {
			return werr
		}
		if n == 0 {
			return errors.New("short write")
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// failed returns the first write failure, if any, and the boundary to cut back to.
func (d *direct) failed() (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.errSafe, d.err
}

// mark records a packet boundary at off (the end of a packet just staged).
func (d *direct) mark(off int64) { d.bounds = append(d.bounds, off) }

// boundAtOrBefore is the newest packet boundary at or before off that staging still
// knows (bounds[0] is never later than the oldest unwritten byte).
func (d *direct) boundAtOrBefore(off int64) int64 {
	b := d.bounds[0]
	for _, x := range d.bounds[1:] {
		if x > off {
			break
		}
		b = x
	}
	return b
}

// submit hands stage[:n] (n a multiple of dirAlign) to the I/O goroutine and carries the
// rest over into a fresh buffer.
func (d *direct) submit(n int) {
	i := 0
	for i+1 < len(d.bounds) && d.bounds[i+1] <= d.base {
		i++
	}
	// Moved down rather than resliced: a slice that keeps losing its front grows a new
	// array every few hundred packets (an allocation per ≈ 30 bytes of packets written).
	d.bounds = d.bounds[:copy(d.bounds, d.bounds[i:])]
	job := dirJob{buf: d.stage[:n], off: d.base, safe: d.bounds[0]}
	nb := d.getBuf()
	nb = append(nb, d.stage[n:]...)
	d.pending.Add(1)
	d.todo <- job
	d.stage, d.base = nb, d.base+int64(n)
}

// submitAligned submits the whole blocks staged so far.
func (d *direct) submitAligned() {
	if n := len(d.stage) &^ (dirAlign - 1); n > 0 {
		d.submit(n)
	}
}

// put copies src into the staging buffers, submitting each full one. With crc set, the
// copy is CRC-checked chunk by chunk right after it is made.
func (d *direct) put(src []byte, crc *uint32) { d.copyIn(src, crc, false) }

// putChecked is put for bytes another process may be writing (the ring): each chunk
// is copied, CRC-checked over the copy, and then compared with the source, which the
// copy has just brought into cache (a CRC pass over the source instead reads it from
// memory a second time, and cost most of the daemon's CPU budget: PERFORMANCE.md). It
// returns false when the source differs from the copy: it changed in between.
func (d *direct) putChecked(src []byte, crc *uint32) bool { return d.copyIn(src, crc, true) }

// copyIn is put and putChecked: chunks of at most crcChunk, so the CRC and the
// comparison read bytes still in cache. It returns false when compare found a change.
func (d *direct) copyIn(src []byte, crc *uint32, compare bool) bool {
	same := true
	for len(src) > 0 {
		if len(d.stage) == cap(d.stage) {
			d.submit(len(d.stage))
		}
		n := min(len(src), cap(d.stage)-len(d.stage), crcChunk)
		at := len(d.stage)
		d.stage = append(d.stage, src[:n]...)
		if crc != nil {
			*crc = d.crcs.update(*crc, d.stage[at:])
		}
		if compare {
			same = same && bytes.Equal(src[:n], d.stage[at:])
		}
		src = src[n:]
	}
	return same
}

// drain submits every whole staged block and waits until the device has taken all
// submitted ones; the bytes left staged are fewer than dirAlign.
func (d *direct) drain() {
	d.submitAligned()
	d.pending.Wait()
}

// writeTail makes the staged partial block durable-ready: O_DIRECT writes whole blocks,
// so it is written padded with zeros and the file cut back to the stream's end. The
// padding is visible for the instant between the two calls (a reader of the live file
// may see zeros after the last packet then, as after a crash at that point), but no byte
// of the stream ever goes through the page cache: a cached copy of a block that O_DIRECT
// also writes could be stale and, once dirtied by a buffered write, be written back over
// the newer bytes.
func (d *direct) writeTail() error {
	n := len(d.stage)
	if n == 0 {
		return nil
	}
	padded := (n + dirAlign - 1) &^ (dirAlign - 1)
	b := d.stage[:padded]
	clear(b[n:])
	if err := d.writeAt(b, d.base); err != nil {
		return err
	}
	var terr error
	if err := d.rc.Control(func(fd uintptr) { terr = unix.Ftruncate(int(fd), d.base+int64(n)) }); err != nil {
		return err
	}
	return terr
}

// reset drops every staged byte and restarts staging at off, with head the file's bytes
// [alignDown(off), off). No job may be in flight.
func (d *direct) reset(off int64, head []byte) {
	d.base = off &^ (dirAlign - 1)
	d.stage = append(d.stage[:0], head[len(head)-int(off-d.base):]...)
	d.bounds = append(d.bounds[:0], off)
}

// stop ends the I/O goroutine once every job is written and clears O_DIRECT again: the
// open file description may be shared (the client passed it), and any unaligned read or
// write through it would fail with EINVAL. The direct value is dead then.
func (d *direct) stop() {
	if d.stopped {
		return
	}
	d.stopped = true
	close(d.todo)
	d.pending.Wait()
	_ = setDirect(d.rc, false) // best effort: the stream itself is complete
	for _, b := range d.owned {
		if d.src != nil {
			d.src.Put(b)
		} else {
			FreeStagingBuf(b)
		}
	}
	d.stage, d.owned = nil, nil
}
