package pipeline

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// Drop is a record the client could not place under policy drop; it becomes a DROP packet.
type Drop struct {
	Seq     uint64
	Name    string
	Step    uint64
	Forward uint64
	// Bytes is the size of the tensor (part) that was lost.
	Bytes uint64
	// Reason is why ("" is written as stream.DefaultDropReason).
	Reason string
}

// Token is one generated token; it becomes a TOKEN packet.
type Token struct {
	Seq     uint64
	Index   uint64
	TokenID int64
	Text    string
	// Position is the token's sequence position (nil: the same as Index).
	Position *int64
}

// Close is what the client says it sent before ending the session.
type Close struct {
	// Seq is the last sequence number it took, Head the head of its last publish, and
	// Drops the number of DROP notices it sent.
	Seq, Head, Drops uint64
}

// Durable are the facts of a checkpoint once every event up to Seq is on disk: what a
// resume must name to continue the stream.
type Durable struct {
	// Seq echoes the checkpoint request.
	Seq uint64
	// Offset is the stream's size after the last packet: a resume appends here.
	Offset uint64
	// Packets, Drops and Tokens count TENSOR/DROP/TOKEN packets, DROP and TOKEN packets.
	Packets, Drops, Tokens uint64
	// LastOffset and LastCRC locate and identify the last packet (0 when there is none).
	LastOffset uint64
	LastCRC    uint32
	// LastSeq is the last packet's sequence number (0 when there is none).
	LastSeq uint64
	// Index, with Env.IndexAtCheckpoint, holds the index entries of the packets written
	// since the previous checkpoint (since the stream began, for the first): an upload
	// that frees the local stream journals them first (stream.JournalRecord).
	Index []stream.IndexEntry
}

type itemKind uint8

const (
	kindTensor itemKind = iota
	kindDrop
	kindToken
	kindCheckpoint
	// kindBatch carries consecutive small tensor records (batch.go) as one element.
	kindBatch
)

// item is one ordered event of a session on its way to the writer: a published record,
// a notice, or a batch of records. Exactly one of rec, drop, tok and batch is meaningful,
// as kind says.
type item struct {
	kind itemKind
	seq  uint64
	rec  shm.Record
	meta []byte
	span *span // ring bytes it holds; nil for notices
	// spanv is a tensor record's span, so that it costs no allocation of its own.
	spanv span
	drop  Drop
	tok   Token
	at    time.Time // when a checkpoint was asked for
	// batch holds a kindBatch element's records, in sequence order; they have no done
	// channel of their own (the batch's covers them).
	batch []*item

	// Filled by the fan-out (fanout.go) for compressed codecs.
	blocks []stream.Block
	stats  []codec.BlockStats // lossy codecs: the error of each block
	grants []grant
	// A record of one block (every small record, and a codec none record's packet) keeps
	// its block and grant here, so they cost no allocation of their own.
	block1  [1]stream.Block
	grant1  [1]grant
	pending atomic.Int32
	done    chan struct{} // closed once every block is compressed (at once for the rest)
	// coded builds the blocks of an FP8 record (the client coded the tensor); nil for
	// every other record.
	coded *codec.FP8Coded
	// A batched record's encoder, from prepareSmall until compressBatch.
	enc       codec.Codec
	se        codec.StatsEncoder
	withStats bool
	errMu     sync.Mutex
	err       error
}

// closedDone is the done channel of every notice: closed once, shared (nothing closes a
// notice's channel again; route gives only tensor records a channel of their own).
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// notice is an item that needs no compression: it is ready as soon as it is queued.
func notice(kind itemKind, seq uint64) *item {
	it := &item{kind: kind, seq: seq, done: closedDone}
	return it
}

// Items of batched records are recycled. A decoding step's 24 records of 2 KiB cost an
// item each (≈ 1 KiB, two thirds of strapd's allocation per record), which ran the garbage
// collector about once per 128-token capture, and its mark workers and stop-the-world
// woke every thread (issue 38). memberPool holds a batch's records' items (and ring TOKEN
// records'), batchPool the batch elements, each with its record slice kept for the next.
var memberPool, batchPool sync.Pool

// newMember returns a zeroed item for a taken record.
func newMember() *item {
	if it, ok := memberPool.Get().(*item); ok {
		return it
	}
	return new(item)
}

// newBatch returns a zeroed batch element whose batch slice is empty, with the capacity of
// a recycled one.
func newBatch() *item {
	if bt, ok := batchPool.Get().(*item); ok {
		return bt
	}
	return new(item)
}

// recycleBatch gives a written batch element and its records' items back, unless a record's
// ring span may still be in the tail tracker (its tail is not yet past the batch's last
// span: the tracker holds pointers into the items until then), in which case the collector
// takes them as before. Only the writer calls it, after writeOne has written the batch:
// nothing else refers to the items then (their compression finished before done closed,
// and the batch slice is the only list that holds them).
func (s *Session) recycleBatch(bt *item) {
	var end uint64
	for _, it := range bt.batch {
		if it.span != nil {
			end = max(end, it.spanv.end)
		}
	}
	// pos is stored after the spans up to it were dropped: it can lag, never lead.
	if s.tail.pos.Load() < end {
		return
	}
	for _, it := range bt.batch {
		if it.done == closedDone || it.done == nil {
			*it = item{}
			memberPool.Put(it)
		}
	}
	keep := bt.batch[:0]
	clear(bt.batch[:cap(bt.batch)])
	*bt = item{batch: keep}
	batchPool.Put(bt)
}

func (it *item) setErr(err error) {
	it.errMu.Lock()
	if it.err == nil {
		it.err = err
	}
	it.errMu.Unlock()
}

func (it *item) getErr() error {
	it.errMu.Lock()
	defer it.errMu.Unlock()
	return it.err
}
