package shm

import (
	"sync/atomic"
	"unsafe"
)

// PublishedOffset is the RingHeader offset of the published cursor (PROTOCOL.md 2): a u64
// position the client stores with release semantics once every record before it is
// complete. 0 means unused. The daemon reads it only when the client died (EOF without
// CLOSE), to take the records the client finished but had not yet named in a message.
const PublishedOffset = 32

// cursor is the published cursor's word inside a header mapping (8-byte aligned: the
// mapping is page-aligned and the offset a multiple of 8).
func cursor(mem []byte) *uint64 {
	_ = mem[PublishedOffset+7]
	return (*uint64)(unsafe.Pointer(&mem[PublishedOffset]))
}

// Published loads the published cursor with acquire semantics: every record the client
// wrote before storing the value read is visible after it.
func (r *Ring) Published() uint64 { return atomic.LoadUint64(cursor(r.mem)) }

// SetPublished stores the published cursor with release semantics, as a client does after
// the records below pos are complete.
func (p *Producer) SetPublished(pos uint64) { atomic.StoreUint64(cursor(p.mem), pos) }
