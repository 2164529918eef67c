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
	// Items queued before a reader-side failure are good and still written; after a codec
	// or write failure nothing more is written (the stream would have a gap).
	stopped := false
	for it := range s.queue {
		<-it.done
		if it.kind != kindBatch {
			stopped = s.writeItem(it, stopped)
			if s.codec == nil && it.span != nil {
				s.tail.free(it.span)
			}
			continue
		}
		if err := it.getErr(); err != nil && !stopped {
			// The batch as a whole failed (its job was never run): none of it is written.
			stopped = true
			s.fail(&Error{Kind: KindInternal, Err: err})
		}
		for _, rec := range it.batch {
			stopped = s.writeItem(rec, stopped)
		}
		if s.codec == nil {
			s.tail.freeAll(it.batch)
		}
	}
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
	start := time.Now()
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
