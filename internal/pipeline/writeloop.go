package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/strap-llm/strap/internal/stream"
)

// writeLoop writes queued items in order. After a fatal error it keeps draining (waiting for
// jobs and returning buffers) without writing.
func (s *Session) writeLoop() {
	defer close(s.writerDone)
	for it := range s.queue {
		<-it.done
		s.writeOne(it)
		s.queued.Add(-1)
	}
}

// writeNow writes a ready item on the caller's goroutine (the connection's) when the
// writer has nothing queued, and reports whether it did. A decoding step's batch and its
// TOKEN are ready when taken, and the writer is idle between steps: writing them here
// spares a goroutine hand-off, and usually an OS thread's wake-up, per step (PERFORMANCE.md,
// "One wake-up per token"). Checkpoints keep to the writer: their fdatasync would hold up
// the connection's reading.
//
// Only the connection's goroutine queues items, so when queued is 0 the writer has
// finished every item (its decrement follows its writes: they are visible here) and will
// take no other until this goroutine queues one: the stream is this goroutine's meanwhile.
func (s *Session) writeNow(it *item) bool {
	if it.kind == kindCheckpoint || s.queued.Load() != 0 {
		return false
	}
	select {
	case <-it.done:
	default:
		return false // still compressing
	}
	s.writeOne(it)
	return true
}

// writeOne writes one ready item (a batch record by record) unless the writer stopped,
// and frees the ring bytes that waited for the write. Items queued before a reader-side
// failure are good and still written; after a codec or write failure nothing more is
// written (the stream would have a gap).
func (s *Session) writeOne(it *item) {
	if it.kind != kindBatch {
		s.stopped = s.writeItem(it, s.stopped)
		if s.codec == nil && it.span != nil {
			s.tail.free(it.span)
		}
		return
	}
	if err := it.getErr(); err != nil && !s.stopped {
		// The batch as a whole failed (its job was never run): none of it is written.
		s.stopped = true
		s.fail(&Error{Kind: KindInternal, Err: err})
	}
	for _, rec := range it.batch {
		s.stopped = s.writeItem(rec, s.stopped)
	}
	if s.codec == nil {
		s.tail.freeAll(it.batch)
	}
	s.recycleBatch(it)
}

// writeItem writes one ready item unless the writer stopped, and returns its buffers and
// memory grants. It reports whether the writer is stopped after it.
func (s *Session) writeItem(it *item, stopped bool) bool {
	if !stopped {
		if err := it.getErr(); err != nil {
			stopped = true
			s.fail(&Error{Kind: KindCodec, Err: fmt.Errorf("compress seq %d (%s): %w", it.seq, it.rec.Name, err)})
		} else if it.kind == kindCheckpoint {
			if err := s.checkpoint(it.seq); err != nil {
				stopped = true
				s.fail(&Error{Kind: KindWrite, Err: fmt.Errorf("checkpoint seq %d: %w", it.seq, err)})
			} else if s.o.Observer != nil {
				s.o.Observer.ObserveCheckpoint(time.Since(it.at))
			}
		} else if err := s.writeAndSync(it); err != nil {
			stopped = true
			kind := KindWrite
			if errors.Is(err, stream.ErrPayloadChanged) {
				// The client broke the protocol (it wrote into published bytes): the
				// stream stays valid up to the previous packet and says so in END.
				kind = KindBadRecord
				err = fmt.Errorf("%w: the client overwrote ring bytes after PUBLISH", err)
			}
			s.fail(&Error{Kind: kind, Err: fmt.Errorf("write seq %d: %w", it.seq, err)})
		}
	}
	for i, b := range it.blocks {
		if b.Data != nil {
			putBuf(b.Data)
		}
		if it.grants != nil && it.grants[i].n > 0 {
			s.o.Lease.release(it.grants[i])
		}
	}
	it.blocks = nil
	return stopped
}

// checkpoint makes everything written so far durable and reports it.
func (s *Session) checkpoint(seq uint64) error {
	if err := s.w.Sync(); err != nil {
		return err
	}
	lo, lc := s.w.LastPacket()
	s.checkpoints.Add(1)
	s.lastCkpt.Store(time.Now().UnixNano())
	d := Durable{Seq: seq, Offset: uint64(s.w.Offset()), Packets: s.w.Packets(),
		Drops: s.w.Drops(), Tokens: s.w.Tokens(), LastOffset: uint64(lo), LastCRC: lc, LastSeq: s.w.LastSeq()}
	if s.o.IndexAtCheckpoint {
		d.Index = s.w.IndexFrom(s.indexed)
		s.indexed = s.w.IndexLen()
	}
	s.o.OnCheckpoint(d)
	s.durableAt = uint64(s.w.Offset())
	s.o.OnDurable(s.durableAt)
	return nil
}

// writeAndSync writes an item and, every DurableEvery bytes, makes the stream durable so
// that an upload can send it without waiting for the client's next checkpoint.
func (s *Session) writeAndSync(it *item) error {
	if err := s.write(it); err != nil {
		return err
	}
	if every := s.o.DurableEvery; every > 0 && uint64(s.w.Offset())-s.durableAt >= every {
		if err := s.w.Sync(); err != nil {
			return err
		}
		s.durableAt = uint64(s.w.Offset())
		s.o.OnDurable(s.durableAt)
	}
	return nil
}

// write writes one item's packet and counts it.
func (s *Session) write(it *item) error {
	p, err := s.packet(it)
	if err != nil {
		return err
	}
	before := s.w.Offset()
	var start time.Time
	if s.o.Observer != nil { // the clock is read only for someone who keeps the figure
		start = time.Now()
	}
	if err := s.w.WritePacket(&p); err != nil {
		return err
	}
	if s.o.Observer != nil {
		s.o.Observer.ObserveWrite(time.Since(start))
	}
	if s.o.WriteDelay > 0 {
		time.Sleep(s.o.WriteDelay)
	}
	switch it.kind {
	case kindTensor:
		s.packets.Add(1)
		s.bytesOut.Add(uint64(s.w.Offset() - before))
	case kindDrop:
		s.drops.Add(1)
		s.packets.Add(1)
	case kindToken:
		s.tokens.Add(1)
		s.packets.Add(1)
	}
	return nil
}
