package stream

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/jsontext"
)

const (
	// bufSize is the write-behind buffer: small packets are packed into it and written
	// with one large sequential write.
	bufSize = 4 << 20
	// copyMax is the largest payload copied into the buffer; bigger ones go out with
	// writev straight from the caller's slices.
	copyMax = 256 << 10
	// iovMax is Linux's IOV_MAX.
	iovMax = 1024
	// writebackKick is how many bytes may be written before the writer asks the kernel to
	// start writing the file's dirty pages back (sync_file_range, asynchronous). Writeback
	// then overlaps the capture instead of piling up for the final fdatasync.
	writebackKick = 32 << 20
)

// indexEntry is one INDEX entry, kept in memory until Close.
type indexEntry struct {
	nameIdx uint32
	typ     PacketType
	flags   uint16
	seq     uint64
	step    uint64
	forward uint64
	offset  uint64
}

// Writer writes one v2 stream to a file it does not own. It is not safe for concurrent
// use: the pipeline's single writer goroutine calls it in sequence order.
type Writer struct {
	f       *os.File
	rc      syscall.RawConn
	regular bool // fdatasync only means something for regular files
	// d, when set, stages every byte and writes with O_DIRECT (direct.go); buf is unused
	// then. directWhy says why a stream that asked for it is written through the page
	// cache instead.
	d         *direct
	directWhy string
	// unkicked counts bytes written since writeback was last started; noKick is set once
	// sync_file_range fails (a file system without it): it is only an optimisation.
	unkicked int64
	noKick   bool

	buf     []byte // pending bytes, written at flush
	off     int64  // stream bytes so far, buffered included
	hdr     []byte // scratch: packet header
	table   []byte // scratch: block table
	iov     [][]byte
	sizes   []int
	raws    []bool
	codecOK map[codec.ID]bool

	packets uint64
	drops   uint64
	tokens  uint64
	lastOff int64  // start of the last TENSOR/DROP/TOKEN packet (0: none yet)
	lastCRC uint32 // its CRC32C field
	// crcs records the file's CRC32C at every grain multiple for an upload (nil: none).
	crcs    *RangeCRCs
	names   map[string]uint32
	nameLst []string
	index   []indexEntry
	payload []byte // the INDEX payload, encoded at Close
	// journaled is how many of the index entries a resume took from an index journal.
	journaled int

	// written is how many bytes of the stream are in the file: every writev call holds
	// whole packets, so it is a packet boundary between calls.
	written int64
	err     error // sticky: after a failed write the stream's tail is unknown
	closed  bool

	// OnSync, when set, receives how long each fdatasync took (metrics).
	OnSync func(time.Duration)
}

// WriterOptions choose how a Writer writes; the zero value writes through the page cache.
type WriterOptions struct {
	// Direct writes a regular file with O_DIRECT from aligned staging buffers
	// (docs/STREAM_FORMAT.md 6), set on f's open file description. Where the file
	// system refuses it, or is tmpfs, the Writer falls back to buffered writes and
	// Direct reports why.
	Direct bool
	// Staging lends the direct writer its staging buffers (nil: it maps its own and
	// unmaps them when the stream ends).
	Staging StagingSource
	// CRCGrain, when positive, has the Writer record the CRC32C of the file's bytes up to
	// every multiple of it (RangeCRCs), from the packets' own CRCs: an upload's parts then
	// need no read-back for their checksums. A resumed stream records none.
	CRCGrain int64
}

// New starts a stream on f: it truncates a non-empty regular file, writes the file
// header with meta as its metadata JSON at offset 0, and buffers it. f stays the caller's.
// meta is anything that marshals to a JSON object (the daemon passes a typed struct, tests
// a map); nil writes {}. Writes are sequential (write/writev from f's position), so f may
// also be a pipe or /dev/null.
func New(f *os.File, meta any) (*Writer, error) { return NewWith(f, meta, WriterOptions{}) }

// NewWith is New with options.
func NewWith(f *os.File, meta any, o WriterOptions) (*Writer, error) {
	mj := []byte("{}")
	if meta != nil {
		var err error
		if mj, err = json.Marshal(meta); err != nil {
			return nil, fmt.Errorf("stream metadata: %w", err)
		}
		if string(mj) == "null" {
			mj = []byte("{}")
		} else if !isJSONObject(mj) {
			return nil, fmt.Errorf("stream metadata is %.20s..., not a JSON object: %w", mj, ErrInvalidPacket)
		}
	}
	if uint64(len(mj)) > 1<<32-1 {
		return nil, fmt.Errorf("stream metadata of %d bytes: %w", len(mj), ErrInvalidPacket)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat stream file: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("stream file: %w", err)
	}
	w := &Writer{
		f:       f,
		rc:      rc,
		regular: st.Mode().IsRegular(),
		codecOK: map[codec.ID]bool{},
		names:   map[string]uint32{},
	}
	if a, ok := spareArrays.Get().(*writerArrays); ok {
		w.index, w.payload = a.index[:0], a.payload[:0]
	}
	if w.regular {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("seek stream file: %w", err)
		}
		if st.Size() > 0 {
			if err := f.Truncate(0); err != nil {
				return nil, fmt.Errorf("truncate stream file: %w", err)
			}
		}
	}
	var h [FileHeaderLen]byte
	copy(h[:8], FileMagic)
	le := binary.LittleEndian
	le.PutUint16(h[8:], Version)
	le.PutUint32(h[12:], uint32(len(mj)))
	crc := crc32.Update(crc32.Update(0, castagnoli, h[:16]), castagnoli, mj)
	le.PutUint32(h[16:], crc)
	w.buf = append(w.buf, h[:]...)
	w.buf = append(w.buf, mj...)
	for len(w.buf)%8 != 0 {
		w.buf = append(w.buf, 0)
	}
	w.off = int64(len(w.buf))
	w.crcs = newRangeCRCs(o.CRCGrain)
	w.crcs.raw(0, w.buf)
	if o.Direct {
		w.startDirect(nil, o.Staging)
	}
	w.writeBehind()
	return w, nil
}

// writeBehind gives a buffered stream its write-behind buffer, keeping what w.buf holds.
// A direct stream stages in its own buffers and never needs one: allocating its 4 MiB
// anyway cost each session the zeroing of them.
func (w *Writer) writeBehind() {
	if w.d == nil {
		w.buf = append(make([]byte, 0, bufSize), w.buf...)
	}
}

// startDirect switches a regular file to O_DIRECT at w.off; head holds the file's bytes
// [alignDown(w.off), w.off) when they are not in w.buf (a resumed stream); src lends
// the staging buffers (nil: the writer's own).
func (w *Writer) startDirect(head []byte, src StagingSource) {
	if !w.regular {
		w.directWhy = "not a regular file"
		return
	}
	at := w.written
	if head != nil {
		at = w.off
	}
	if w.d, w.directWhy = enableDirect(w.rc, at, head, src); w.d == nil {
		return
	}
	w.d.crcs = w.crcs
	w.d.put(w.buf, nil) // the file header of a new stream
	w.d.mark(w.off)
	w.buf = nil
}

// Direct reports whether the stream is written with O_DIRECT, and if not, why (empty
// when it was not asked for).
func (w *Writer) Direct() (bool, string) {
	if w.d != nil && w.d.refused.Load() {
		return false, "the file system took O_DIRECT but failed a write with EINVAL"
	}
	return w.d != nil, w.directWhy
}

// RangeCRCs is the record of the file's CRC32C at grain multiples (nil without
// WriterOptions.CRCGrain, and for a resumed stream).
func (w *Writer) RangeCRCs() *RangeCRCs { return w.crcs }

// Offset is the number of stream bytes written so far, buffered ones included; the next
// packet starts there.
func (w *Writer) Offset() int64 { return w.off }

// Packets is the number of TENSOR, DROP and TOKEN packets written.
func (w *Writer) Packets() uint64 { return w.packets }

// Drops is the number of DROP packets written.
func (w *Writer) Drops() uint64 { return w.drops }

// Tokens is the number of TOKEN packets written.
func (w *Writer) Tokens() uint64 { return w.tokens }

// LastPacket is the start offset and CRC32C field of the last TENSOR, DROP or TOKEN packet
// (0, 0 when there is none): with Offset, what a checkpoint records.
func (w *Writer) LastPacket() (offset int64, crc uint32) { return w.lastOff, w.lastCRC }

// Err is the write error that stopped the stream, if any.
func (w *Writer) Err() error { return w.err }

// validate checks p against the format rules and returns its stored length.
func (w *Writer) validate(p *Packet) (uint64, error) {
	switch p.Type {
	case TypeTensor, TypeDrop, TypeToken:
	default:
		return 0, fmt.Errorf("type %v: only TENSOR, DROP and TOKEN are written by WritePacket: %w", p.Type, ErrInvalidPacket)
	}
	if len(p.Shape) > MaxNDim {
		return 0, fmt.Errorf("%d dimensions > %d: %w", len(p.Shape), MaxNDim, ErrInvalidPacket)
	}
	if len(p.Name) > 0xffff {
		return 0, fmt.Errorf("name of %d bytes: %w", len(p.Name), ErrInvalidPacket)
	}
	if uint64(len(p.Meta)) > 1<<31 || (len(p.Meta) > 0 && !isJSONObject(p.Meta)) {
		return 0, fmt.Errorf("meta is not a JSON object: %w", ErrInvalidPacket)
	}
	// Names and meta are UTF-8 (STREAM_FORMAT.md 3); the reader refuses anything else, so
	// writing it would make a stream that does not read back.
	if !utf8.ValidString(p.Name) {
		return 0, fmt.Errorf("name %q is not valid UTF-8: %w", p.Name, ErrInvalidPacket)
	}
	if err := jsontext.Check(p.Meta); err != nil {
		return 0, fmt.Errorf("meta of %q: %w: %w", p.Name, err, ErrInvalidPacket)
	}
	var stored uint64
	if p.Codec == codec.None {
		for _, b := range p.Blocks {
			stored += uint64(len(b.Data))
		}
		if p.Type == TypeTensor && stored != p.RawLen {
			return 0, fmt.Errorf("codec none: blocks hold %d bytes, raw_len %d: %w", stored, p.RawLen, ErrInvalidPacket)
		}
	} else {
		if !w.codecOK[p.Codec] {
			if _, err := codec.ByID(p.Codec); err != nil {
				return 0, fmt.Errorf("packet codec: %w: %w", err, ErrInvalidPacket)
			}
			w.codecOK[p.Codec] = true
		}
		if p.BlockSize == 0 || p.BlockSize > codec.MaxBlockSize {
			return 0, fmt.Errorf("block_size %d not in 1..%d: %w", p.BlockSize, codec.MaxBlockSize, ErrInvalidPacket)
		}
		if n := codec.BlockCount(int(min(p.RawLen, 1<<62)), int(p.BlockSize)); uint64(len(p.Blocks)) != uint64(n) {
			return 0, fmt.Errorf("%d blocks, raw_len %d at block_size %d needs %d: %w",
				len(p.Blocks), p.RawLen, p.BlockSize, n, ErrInvalidPacket)
		}
		stored = uint64(codec.TableLen(len(p.Blocks)))
		for i, b := range p.Blocks {
			if uint64(len(b.Data)) >= codec.RawBit {
				return 0, fmt.Errorf("block %d of %d bytes: %w", i, len(b.Data), ErrInvalidPacket)
			}
			if b.Raw {
				if want := min(uint64(p.BlockSize), p.RawLen-uint64(i)*uint64(p.BlockSize)); uint64(len(b.Data)) != want {
					return 0, fmt.Errorf("raw block %d holds %d bytes, decodes to %d: %w", i, len(b.Data), want, ErrInvalidPacket)
				}
			}
			stored += uint64(len(b.Data))
		}
	}
	if p.Type != TypeTensor && len(p.Blocks) != 0 {
		return 0, fmt.Errorf("%v packets carry no payload: %w", p.Type, ErrInvalidPacket)
	}
	h := p.Header
	h.StoredLen = stored
	if err := h.check(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidPacket, err)
	}
	return stored, nil
}

// isJSONObject reports whether b is one valid JSON object.
func isJSONObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return json.Valid(b)
		}
		return false
	}
	return false
}

// WritePacket appends one TENSOR, DROP or TOKEN packet. Small packets are copied into the
// buffer; a large payload is written with writev straight from p.Blocks, so it is never
// copied and never retained after the call returns. TensorLen 0 on a non-PART packet is
// taken as RawLen. An invalid packet returns ErrInvalidPacket and writes nothing; a
// write error is returned and sticks: every later call returns it.
func (w *Writer) WritePacket(p *Packet) error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	if p.TensorLen == 0 && p.Flags&FlagPart == 0 {
		q := *p
		q.TensorLen = q.RawLen
		p = &q
	}
	stored, err := w.validate(p)
	if err != nil {
		return fmt.Errorf("write packet seq %d: %w", p.Seq, err)
	}
	if err := w.writePacket(p, stored); err != nil {
		w.crcs.abort()
		return err
	}
	w.crcs.commit(int64(len(w.hdr))+int64(stored), binary.LittleEndian.Uint32(w.hdr[20:]))
	w.account(p.Name, p.Type, p.Flags, p.Seq, p.Step, p.Forward, w.off)
	w.lastOff, w.lastCRC = w.off, binary.LittleEndian.Uint32(w.hdr[20:])
	w.off += int64(len(w.hdr)) + int64(stored)
	return nil
}

// account counts a TENSOR, DROP or TOKEN packet at offset off and adds its index entry;
// shared by WritePacket and Resume (which replays the packets already in the file).
func (w *Writer) account(name string, typ PacketType, flags uint8, seq, step, forward uint64, off int64) {
	idx, ok := w.names[name]
	if !ok {
		idx = uint32(len(w.nameLst))
		w.names[name] = idx
		w.nameLst = append(w.nameLst, name)
	}
	w.packets++
	switch typ {
	case TypeDrop:
		w.drops++
	case TypeToken:
		w.tokens++
	}
	w.index = append(w.index, indexEntry{nameIdx: idx, typ: typ, flags: uint16(flags),
		seq: seq, step: step, forward: forward, offset: uint64(off)})
}

// writePacket encodes p's header, computes the CRC and writes header, table and payload.
// It does not advance w.off; the caller does once the packet is accounted for.
//
// The CRC must cover exactly the bytes that reach the file, also when p.Shared blocks can
// change under us: a small packet is copied into the buffer first and its CRC computed over
// that copy; a large one goes out with writev straight from the blocks, so their CRC is
// computed before and again after the write, and a difference is ErrPayloadChanged.
func (w *Writer) writePacket(p *Packet, stored uint64) error {
	if w.d != nil {
		if err := w.checkDirect(); err != nil {
			return err
		}
	}
	w.crcs.begin(w.off)
	w.hdr = appendHeader(w.hdr[:0], p, stored)
	w.table = w.table[:0]
	if p.Codec != codec.None {
		w.sizes, w.raws = w.sizes[:0], w.raws[:0]
		for _, b := range p.Blocks {
			w.sizes = append(w.sizes, len(b.Data))
			w.raws = append(w.raws, b.Raw)
		}
		var err error
		if w.table, err = codec.AppendBlockTable(w.table, w.sizes, w.raws); err != nil {
			return fmt.Errorf("write packet seq %d: %w", p.Seq, err)
		}
	}
	if w.d != nil {
		return w.writePacketDirect(p, stored)
	}
	total := uint64(len(w.hdr)) + stored
	if total <= copyMax {
		if uint64(len(w.buf))+total > bufSize {
			if err := w.flush(); err != nil {
				return err
			}
		}
		start := len(w.buf)
		w.buf = append(w.buf, w.hdr...)
		w.buf = append(w.buf, w.table...)
		for _, b := range p.Blocks {
			w.buf = append(w.buf, b.Data...)
		}
		crc := w.crcs.update(0, w.buf[start:])
		binary.LittleEndian.PutUint32(w.buf[start+20:], crc)
		binary.LittleEndian.PutUint32(w.hdr[20:], crc)
		return nil
	}
	head := w.crcs.update(w.crcs.update(0, w.hdr), w.table)
	crc := w.crcs.payloadCRC(head, p.Blocks)
	binary.LittleEndian.PutUint32(w.hdr[20:], crc)
	iov := append(w.iov[:0], w.buf, w.hdr, w.table)
	for _, b := range p.Blocks {
		if len(b.Data) > 0 {
			iov = append(iov, b.Data)
		}
	}
	err := w.writev(iov)
	clear(iov) // drop references to the caller's slices
	w.iov = iov[:0]
	w.buf = w.buf[:0]
	if err != nil || !p.Shared {
		return err
	}
	if again := payloadCRC(head, p.Blocks); again != crc {
		return w.unwrite(fmt.Errorf("packet seq %d (%s): crc %#08x before the write, %#08x after: %w",
			p.Seq, p.Name, crc, again, ErrPayloadChanged))
	}
	return nil
}

// writePacketDirect stages header, table and payload (w.hdr and w.table built) for
// O_DIRECT. A packet that fits in the staging buffer is copied first and its CRC computed
// over the copy, which the client cannot change, so the CRC covers the bytes written; a
// shared payload's chunks are also compared with the ring after their copy, to catch a
// client writing into published bytes (ErrPayloadChanged, nothing written). A
// larger packet's header must leave before its payload is copied, so its CRC is computed
// over the source first and, for a shared payload, again over the copy; a difference is
// ErrPayloadChanged and the packet is cut off the file.
func (w *Writer) writePacketDirect(p *Packet, stored uint64) error {
	d := w.d
	total := len(w.hdr) + int(stored) // stored counts the block table
	end := w.off + int64(total)
	if len(d.stage)+total > cap(d.stage) {
		d.submitAligned()
	}
	if len(d.stage)+total <= cap(d.stage) {
		start := len(d.stage)
		var crc uint32
		d.put(w.hdr, &crc)
		d.put(w.table, &crc)
		if p.Shared {
			same := true
			for _, b := range p.Blocks {
				same = d.putChecked(b.Data, &crc) && same
			}
			if !same {
				// Nothing of the packet has left the buffer: it fits.
				d.stage = d.stage[:start]
				return fmt.Errorf("packet seq %d (%s): the ring differs from the copy to be written: %w",
					p.Seq, p.Name, ErrPayloadChanged)
			}
		} else {
			for _, b := range p.Blocks {
				d.put(b.Data, &crc)
			}
		}
		binary.LittleEndian.PutUint32(d.stage[start+20:], crc)
		binary.LittleEndian.PutUint32(w.hdr[20:], crc)
		d.mark(end)
		return w.checkDirect()
	}
	// The bytes before the packet in its first block, to stage again if it is cut off.
	var saved [dirAlign]byte
	lead := saved[:w.off&(dirAlign-1)]
	copy(lead, d.stage[w.off-int64(len(lead))-d.base:])
	// The record of the file's CRCs (w.crcs) follows the bytes written: for a shared
	// payload the pass over the copy, otherwise the one over the blocks (the same bytes).
	head := w.crcs.update(w.crcs.update(0, w.hdr), w.table)
	var crc uint32
	if p.Shared {
		crc = payloadCRC(head, p.Blocks)
	} else {
		crc = w.crcs.payloadCRC(head, p.Blocks)
	}
	binary.LittleEndian.PutUint32(w.hdr[20:], crc)
	d.put(w.hdr, nil)
	d.put(w.table, nil)
	again := head
	var check *uint32
	if p.Shared {
		check = &again
	}
	for _, b := range p.Blocks {
		d.put(b.Data, check)
	}
	if check == nil || again == crc {
		d.mark(end)
		return w.checkDirect()
	}
	d.pending.Wait()
	if err := w.checkDirect(); err != nil {
		return err
	}
	err := fmt.Errorf("packet seq %d (%s): crc %#08x over the ring, %#08x over the copy written: %w",
		p.Seq, p.Name, crc, again, ErrPayloadChanged)
	var terr error
	if cerr := w.rc.Control(func(fd uintptr) { terr = unix.Ftruncate(int(fd), w.off) }); cerr != nil || terr != nil {
		w.err = fmt.Errorf("%w; cutting it off the file: %w", err, errors.Join(cerr, terr))
		return w.err
	}
	d.reset(w.off, lead)
	return err
}

// checkDirect turns a failed O_DIRECT write into the stream's sticky error, once every
// write in flight is done, and cuts the file back to the packet boundary before the
// failed write.
func (w *Writer) checkDirect() error {
	if w.err != nil {
		return w.err
	}
	if _, err := w.d.failed(); err == nil {
		return nil
	}
	w.d.pending.Wait()
	safe, err := w.d.failed()
	w.cutTo(safe)
	w.err = fmt.Errorf("write stream: %w%s", err, w.freeSpace())
	return w.err
}

// payloadCRC continues crc over every block.
func payloadCRC(crc uint32, blocks []Block) uint32 {
	for _, b := range blocks {
		crc = crc32.Update(crc, castagnoli, b.Data)
	}
	return crc
}

// unwrite cuts the packet just written (it starts at w.off) off a regular file, so the
// stream ends on its previous packet and stays writable; err is returned. Where the file
// cannot be cut (a pipe), or cutting fails, err sticks: the stream is dead.
func (w *Writer) unwrite(err error) error {
	cerr := errors.New("output is not a regular file")
	if w.regular {
		var terr error
		cerr = w.rc.Control(func(fd uintptr) {
			if terr = unix.Ftruncate(int(fd), w.off); terr == nil {
				_, terr = unix.Seek(int(fd), w.off, io.SeekStart)
			}
		})
		if cerr == nil {
			cerr = terr
		}
		if cerr == nil {
			w.written = w.off
		}
	}
	if cerr != nil {
		w.err = fmt.Errorf("%w; cutting it off the file: %w", err, cerr)
		return w.err
	}
	return err
}

// flush writes the buffer.
func (w *Writer) flush() error {
	if len(w.buf) == 0 || w.err != nil {
		return w.err
	}
	w.iov = append(w.iov[:0], w.buf)
	err := w.writev(w.iov)
	w.iov[0] = nil
	w.buf = w.buf[:0]
	return err
}

// writev writes every byte of iov, resuming after short writes and EINTR/EAGAIN. On error
// (a full disk, an I/O error) the stream is dead and the error sticks; a regular file is cut
// back to where this call began, a packet boundary, so every packet in it stays whole and
// verifies, and the error says how much space the file system has left.
func (w *Writer) writev(iov [][]byte) error {
	start := w.written
	defer func() {
		if w.err != nil {
			w.cutTo(start)
		}
	}()
	for len(iov) > 0 {
		for len(iov) > 0 && len(iov[0]) == 0 {
			iov = iov[1:]
		}
		if len(iov) == 0 {
			break
		}
		chunk := iov[:min(len(iov), iovMax)]
		var n int
		var werr error
		err := w.rc.Write(func(fd uintptr) bool {
			for {
				n, werr = unix.Writev(int(fd), chunk)
				if werr != unix.EINTR {
					break
				}
			}
			return werr != unix.EAGAIN
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			w.err = fmt.Errorf("write stream: %w%s", err, w.freeSpace())
			return w.err
		}
		if n == 0 {
			w.err = fmt.Errorf("write stream: %w%s", io.ErrShortWrite, w.freeSpace())
			return w.err
		}
		w.written += int64(n)
		w.unkicked += int64(n)
		for n > 0 {
			if n >= len(iov[0]) {
				n -= len(iov[0])
				iov = iov[1:]
			} else {
				iov[0] = iov[0][n:]
				n = 0
			}
		}
	}
	if w.unkicked >= writebackKick {
		w.kickWriteback()
	}
	return nil
}

// cutTo cuts a regular file back to off after a failed write; best effort, since the file
// system is failing: a tail that cannot be cut reads as a torn packet.
func (w *Writer) cutTo(off int64) {
	if !w.regular {
		return
	}
	_ = w.rc.Control(func(fd uintptr) {
		if unix.Ftruncate(int(fd), off) == nil {
			_, _ = unix.Seek(int(fd), off, io.SeekStart)
		}
	})
	w.written = off
}

// freeSpace describes the space left on the file's file system, for write errors: a full
// disk is the usual cause and the number tells.
func (w *Writer) freeSpace() string {
	if !w.regular {
		return ""
	}
	var st unix.Statfs_t
	var serr error
	if err := w.rc.Control(func(fd uintptr) { serr = unix.Fstatfs(int(fd), &st) }); err != nil || serr != nil {
		return ""
	}
	free := st.Bavail * uint64(st.Bsize)
	return fmt.Sprintf(" (%d bytes free of %d on the stream's file system)", free, st.Blocks*uint64(st.Bsize))
}

// kickWriteback starts writeback of every dirty page of the file without waiting for it.
// Errors are not the stream's: a failed write-out surfaces at the next fdatasync.
func (w *Writer) kickWriteback() {
	w.unkicked = 0
	if !w.regular || w.noKick {
		return
	}
	var kerr error
	if err := w.rc.Control(func(fd uintptr) {
		kerr = unix.SyncFileRange(int(fd), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
	}); err != nil || kerr != nil {
		w.noKick = true
	}
}

// Sync writes the buffer and fdatasyncs the file (a no-op for pipes and devices).
func (w *Writer) Sync() error {
	if w.closed {
		return ErrClosed
	}
	return w.sync()
}

func (w *Writer) sync() error {
	if w.d != nil {
		if w.err != nil {
			return w.err
		}
		w.d.drain()
		if err := w.checkDirect(); err != nil {
			return err
		}
		if err := w.d.writeTail(); err != nil {
			// The whole blocks before the tail are on the file; what the failed write
			// left after them is cut back to the packet boundary they end in.
			w.cutTo(w.d.boundAtOrBefore(w.d.base))
			w.err = fmt.Errorf("write stream: %w%s", err, w.freeSpace())
			return w.err
		}
	} else if err := w.flush(); err != nil {
		return err
	}
	if !w.regular {
		return nil
	}
	var serr error
	start := time.Now()
	if err := w.rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		serr = err
	}
	if w.OnSync != nil {
		w.OnSync(time.Since(start))
	}
	if serr != nil {
		w.err = fmt.Errorf("fdatasync stream: %w%s", serr, w.freeSpace())
		return w.err
	}
	return nil
}

// Close ends the stream: END packet, INDEX packet, footer, flush and fdatasync. It does
// not close the file. After a write error it returns that error and writes nothing more
// (the stream then reads as cut short).
func (w *Writer) Close(end EndInfo) error {
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	if w.d != nil {
		defer w.d.stop()
	}
	if w.err != nil {
		return w.err
	}
	switch end.Status {
	case "complete", "aborted", "error":
	default:
		w.err = fmt.Errorf("end status %q: %w", end.Status, ErrInvalidPacket)
		return w.err
	}
	em := EndMeta{Status: end.Status, Packets: end.Packets, Drops: end.Drops, Error: end.Error}
	if em.Packets == 0 {
		em.Packets = w.packets
	}
	if em.Drops == 0 {
		em.Drops = w.drops
	}
	meta, err := json.Marshal(em)
	if err != nil {
		return fmt.Errorf("end meta: %w", err)
	}
	if err := w.writePacket(&Packet{Header: Header{Type: TypeEnd}, Meta: meta}, 0); err != nil {
		return err
	}
	w.crcs.commit(int64(len(w.hdr)), binary.LittleEndian.Uint32(w.hdr[20:]))
	w.off += int64(len(w.hdr))

	indexOff := w.off
	payload := w.indexPayload()
	ip := &Packet{Header: Header{Type: TypeIndex, RawLen: uint64(len(payload)), TensorLen: uint64(len(payload))}, Blocks: []Block{{Data: payload}}}
	if err := w.writePacket(ip, uint64(len(payload))); err != nil {
		return err
	}
	w.crcs.commit(int64(len(w.hdr))+int64(len(payload)), binary.LittleEndian.Uint32(w.hdr[20:]))
	w.off += int64(len(w.hdr)) + int64(len(payload))

	var foot [FooterLen]byte
	binary.LittleEndian.PutUint64(foot[:], uint64(indexOff))
	copy(foot[8:], FooterMagic)
	w.crcs.raw(w.off, foot[:])
	if w.d != nil {
		w.d.put(foot[:], nil)
	} else {
		if len(w.buf)+FooterLen > bufSize {
			if err := w.flush(); err != nil {
				return err
			}
		}
		w.buf = append(w.buf, foot[:]...)
	}
	w.off += FooterLen
	return w.sync()
}

// Abort ends the stream with status "aborted" (cause nil) or "error" (cause set).
func (w *Writer) Abort(cause error) error {
	if cause == nil {
		return w.Close(EndInfo{Status: "aborted"})
	}
	return w.Close(EndInfo{Status: "error", Error: cause.Error()})
}

// indexPayload encodes the INDEX payload (docs/STREAM_FORMAT.md 3).
func (w *Writer) indexPayload() []byte {
	w.payload = appendIndexPayload(w.payload[:0], w.nameLst, w.index)
	return w.payload
}

// writerArrays are the arrays a Writer grows with its stream (an index entry per packet,
// the INDEX payload at Close), handed from a released Writer to the next one. Grown afresh
// for every session they were half of what strapd allocated per decode capture, and the
// garbage collector's runs with them (issue 38).
type writerArrays struct {
	index   []indexEntry
	payload []byte
}

var spareArrays sync.Pool

// Release gives the Writer's index arrays to a later Writer. Call it once the stream is
// closed (or abandoned) and nothing will call the Writer again.
func (w *Writer) Release() {
	if w.index == nil && w.payload == nil {
		return
	}
	spareArrays.Put(&writerArrays{index: w.index[:0], payload: w.payload[:0]})
	w.index, w.payload = nil, nil
}

// encodeIndexPayload is the INDEX payload of entries whose names are names[e.nameIdx]: the
// stream's INDEX packet and the records of an index journal (journal.go).
func encodeIndexPayload(names []string, index []indexEntry) []byte {
	return appendIndexPayload(nil, names, index)
}

// appendIndexPayload appends encodeIndexPayload's bytes to b.
func appendIndexPayload(b []byte, names []string, index []indexEntry) []byte {
	n := 4 + 8 + IndexEntryLen*len(index)
	for _, s := range names {
		n += 2 + len(s)
	}
	le := binary.LittleEndian
	b = slices.Grow(b, n)
	b = le.AppendUint32(b, uint32(len(names)))
	for _, s := range names {
		b = le.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = le.AppendUint64(b, uint64(len(index)))
	for _, e := range index {
		b = le.AppendUint32(b, e.nameIdx)
		b = le.AppendUint16(b, uint16(e.typ))
		b = le.AppendUint16(b, e.flags)
		b = le.AppendUint64(b, e.seq)
		b = le.AppendUint64(b, e.step)
		b = le.AppendUint64(b, e.forward)
		b = le.AppendUint64(b, e.offset)
	}
	return b
}

// IndexLen is how many index entries the writer holds (one per TENSOR/DROP/TOKEN packet).
func (w *Writer) IndexLen() int { return len(w.index) }

// IndexFrom is the index entries from the i-th on, names resolved (an upload's index
// journal, stream.JournalRecord).
func (w *Writer) IndexFrom(i int) []IndexEntry {
	if i >= len(w.index) {
		return nil
	}
	out := make([]IndexEntry, 0, len(w.index)-i)
	for _, e := range w.index[i:] {
		out = append(out, IndexEntry{Header: Header{Type: e.typ, Flags: uint8(e.flags), Seq: e.seq, Step: e.step, Forward: e.forward},
			Name: w.nameLst[e.nameIdx], Offset: int64(e.offset)})
	}
	return out
}

// LastSeq is the sequence number of the last TENSOR/DROP/TOKEN packet (0: none yet).
func (w *Writer) LastSeq() uint64 {
	if len(w.index) == 0 {
		return 0
	}
	return w.index[len(w.index)-1].seq
}

// JournaledEntries is how many index entries a resume took from its index journal (the
// first ones; 0 when none).
func (w *Writer) JournaledEntries() int { return w.journaled }
