package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ProducerOptions configure a Producer.
type ProducerOptions struct {
	// Name labels the memfd (visible in /proc/PID/fd); "strap-ring" when empty.
	Name string
	// NoSeal leaves the memfd unsealed (tests of the daemon's refusal only).
	NoSeal bool
	// PartSize is the most payload bytes per record when a tensor is split into parts;
	// 0 picks a quarter of the data region (PROTOCOL.md section 2).
	PartSize uint64
}

// Producer is the writing side of a ring, as the Python client implements it: it creates a
// sealed memfd, writes the header, places records (with PAD at the wrap) and tracks head,
// tail and sequence numbers. It is not safe for concurrent use.
type Producer struct {
	file     *os.File
	mem      []byte
	data     []byte
	dataSize uint64
	head     uint64
	tail     uint64
	nextSeq  uint64
	partSize uint64
}

// NewProducer creates a ring memfd of ringSize bytes, maps it read-write and writes its
// header.
func NewProducer(ringSize uint64, opts ProducerOptions) (*Producer, error) {
	if err := CheckRingSize(ringSize); err != nil {
		return nil, err
	}
	name := opts.Name
	if name == "" {
		name = "strap-ring"
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, int64(ringSize)); err != nil {
		f.Close()
		return nil, fmt.Errorf("size ring: %w", err)
	}
	if !opts.NoSeal {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			f.Close()
			return nil, fmt.Errorf("seal ring: %w", err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(ringSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map ring: %w", err)
	}
	PutHeader(mem, ringSize)
	p := &Producer{file: f, mem: mem, data: mem[HeaderSize:], dataSize: ringSize - HeaderSize, nextSeq: 1}
	p.partSize = opts.PartSize
	if p.partSize == 0 {
		p.partSize = p.dataSize / 4
	}
	p.partSize &^= Align - 1
	if p.partSize == 0 {
		p.partSize = Align
	}
	return p, nil
}

// File is the memfd, to be sent to the daemon in OPEN.
func (p *Producer) File() *os.File { return p.file }

// Mem is the whole read-write mapping (header included), for tests that corrupt records.
func (p *Producer) Mem() []byte { return p.mem }

// DataSize is the size of the data region.
func (p *Producer) DataSize() uint64 { return p.dataSize }

// Head is the position after the last record placed.
func (p *Producer) Head() uint64 { return p.head }

// Tail is the newest position released by the daemon.
func (p *Producer) Tail() uint64 { return p.tail }

// Free is the number of bytes that may be written before the next release.
func (p *Producer) Free() uint64 { return p.dataSize - (p.head - p.tail) }

// LastSeq is the last sequence number taken (0 before the first).
func (p *Producer) LastSeq() uint64 { return p.nextSeq - 1 }

// TakeSeq takes the next sequence number for an event that is not a ring record (a DROP
// or TOKEN notice).
func (p *Producer) TakeSeq() uint64 {
	s := p.nextSeq
	p.nextSeq++
	return s
}

// Release records a tail sent by the daemon. Tails only grow and never pass the head.
func (p *Producer) Release(tail uint64) error {
	if tail < p.tail || tail > p.head {
		return fmt.Errorf("release tail %d outside [%d, %d]", tail, p.tail, p.head)
	}
	p.tail = tail
	return nil
}

// Split cuts t into the records it is placed as: itself when it fits in the ring's part
// size, else PART records of at most the part size each (Shape stays the whole tensor's).
func (p *Producer) Split(t *Tensor) []Tensor {
	if t.RecordLen() <= p.dataSize && uint64(len(t.Payload)) <= p.partSize {
		return []Tensor{*t}
	}
	var parts []Tensor
	total := uint64(len(t.Payload))
	for off := uint64(0); off < total || (total == 0 && len(parts) == 0); {
		n := min(p.partSize, total-off)
		part := *t
		part.Flags |= FlagPart
		part.PartOffset = off
		part.TensorLen = total
		part.Payload = t.Payload[off : off+n]
		parts = append(parts, part)
		off += n
	}
	return parts
}

// need is the ring space a record of n bytes takes at the current head, PAD included.
func (p *Producer) need(n uint64) (pad, total uint64) {
	off := p.head % p.dataSize
	if off+n > p.dataSize {
		pad = p.dataSize - off
	}
	return pad, pad + n
}

// Fits reports whether a record of t's size can be placed now.
func (p *Producer) Fits(t *Tensor) bool {
	_, total := p.need(t.RecordLen())
	return total <= p.Free()
}

// Put places t as one record (PAD first when it would wrap), taking the next sequence
// number. It returns ErrRingFull when the space is not free yet and ErrTooLarge when it
// never will be (use Split first).
func (p *Producer) Put(t *Tensor) (seq uint64, err error) {
	n := t.RecordLen()
	dst, seq, err := p.place(n, "record")
	if err != nil {
		return 0, err
	}
	PutRecord(dst, t, seq)
	return seq, nil
}

// place reserves n contiguous bytes at the head (PAD first when they would wrap) and takes
// the next sequence number; what names the record in ErrTooLarge's message.
func (p *Producer) place(n uint64, what string) (dst []byte, seq uint64, err error) {
	if n > p.dataSize {
		return nil, 0, fmt.Errorf("%w: %s of %d bytes, data region %d", ErrTooLarge, what, n, p.dataSize)
	}
	pad, total := p.need(n)
	if total > p.Free() {
		return nil, 0, ErrRingFull
	}
	if pad > 0 {
		PutPad(p.data[p.head%p.dataSize:], pad)
		p.head += pad
	}
	seq = p.TakeSeq()
	off := p.head % p.dataSize
	p.head += n
	return p.data[off : off+n], seq, nil
}

// PutToken places a TOKEN record (PROTOCOL.md 2) as Put places a tensor, taking the next
// sequence number.
func (p *Producer) PutToken(index uint64, tokenID, position int64, text string) (seq uint64, err error) {
	dst, seq, err := p.place(TokenRecordLen(len(text)), "token record")
	if err != nil {
		return 0, err
	}
	AppendToken(dst[:0], seq, index, tokenID, position, text) // cap(dst[:0]) is the record: written in place
	return seq, nil
}

// Close unmaps the ring and closes the memfd.
func (p *Producer) Close() error {
	var errs []error
	if p.mem != nil {
		if err := unix.Munmap(p.mem); err != nil {
			errs = append(errs, fmt.Errorf("unmap ring: %w", err))
		}
		p.mem, p.data = nil, nil
	}
	if err := p.file.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		errs = append(errs, fmt.Errorf("close ring: %w", err))
	}
	return errors.Join(errs...)
}
