package pipeline

import (
	"encoding/json"
	"time"

	"github.com/strap-llm/strap/internal/shm"
)

// input is the session's reading side, used only by the connection's goroutine: where the
// last publish ended and which sequence number comes next.
type input struct {
	rd      *shm.Reader
	head    uint64
	nextSeq uint64
	dropsIn uint64
}

// Publish takes the window [previous head, head): it parses every record in it and queues
// them. seq is the last tensor record's sequence number in the window. It returns the
// session's fatal error when the window is bad or the session already failed.
func (s *Session) Publish(head, seq uint64) error {
	if e := s.Err(); e != nil {
		return e
	}
	in := &s.in
	if head < in.head {
		return s.fail(errf(KindBadRecord, "publish head %d, expected at least the previous head %d", head, in.head))
	}
	tail := s.tail.current()
	if ds := s.o.Ring.DataSize(); head-tail > ds {
		return s.fail(errf(KindBadRecord, "publish head %d is more than data_size %d past tail %d", head, ds, tail))
	}
	in.head = head
	s.headA.Store(head)
	var last uint64
	for in.rd.Pos() < head {
		rec, pos, err := in.rd.Next(head)
		if err != nil {
			return s.fail(&Error{Kind: KindBadRecord, Err: err})
		}
		sp := s.tail.add(pos + rec.Len)
		if rec.Kind == shm.KindPad {
			s.tail.free(sp)
			continue
		}
		if rec.Seq != in.nextSeq {
			s.tail.free(sp)
			return s.fail(errf(KindTornRecord, "record at position %d has seq %d, expected %d", pos, rec.Seq, in.nextSeq))
		}
		in.nextSeq++
		last = rec.Seq
		it := &item{kind: kindTensor, seq: rec.Seq, rec: rec, span: sp, done: make(chan struct{})}
		// Name and meta are copied: the client may reuse the bytes once released.
		if len(rec.Meta) > 0 {
			it.meta = append([]byte(nil), rec.Meta...)
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(it.meta, &obj); err != nil {
				s.tail.free(sp)
				return s.fail(errf(KindBadRecord, "record seq %d: meta is not a JSON object: %v", rec.Seq, err))
			}
		}
		s.bytesIn.Add(uint64(len(rec.Payload)))
		if err := s.dispatch(it); err != nil {
			return err
		}
	}
	if last != 0 && last != seq {
		return s.fail(errf(KindTornRecord, "publish says last seq %d, window ends with record seq %d", seq, last))
	}
	return nil
}

// Drop takes a DROP notice: it takes the next sequence number and becomes a DROP packet.
func (s *Session) Drop(d Drop) error {
	if e := s.Err(); e != nil {
		return e
	}
	if d.Seq != s.in.nextSeq {
		return s.fail(errf(KindTornRecord, "drop %q has seq %d, expected %d", d.Name, d.Seq, s.in.nextSeq))
	}
	if d.Name == "" || len(d.Name) > shm.MaxNameLen {
		return s.fail(errf(KindBadRequest, "drop seq %d: name length %d, expected 1..%d", d.Seq, len(d.Name), shm.MaxNameLen))
	}
	s.in.nextSeq++
	s.in.dropsIn++
	it := notice(kindDrop, d.Seq)
	it.drop = d
	return s.enqueue(it)
}

// Token takes a TOKEN notice: it takes the next sequence number and becomes a TOKEN packet.
func (s *Session) Token(t Token) error {
	if e := s.Err(); e != nil {
		return e
	}
	if t.Seq != s.in.nextSeq {
		return s.fail(errf(KindTornRecord, "token has seq %d, expected %d", t.Seq, s.in.nextSeq))
	}
	s.in.nextSeq++
	if s.o.Observer != nil {
		s.o.Observer.ObserveToken(s.o.ID, time.Now())
	}
	it := notice(kindToken, t.Seq)
	it.tok = t
	return s.enqueue(it)
}

// Checkpoint asks for every event up to seq (the last sequence number taken) to be written
// and fdatasynced; Env.OnCheckpoint then reports the durable facts. A seq other than the
// last one received is a fatal torn record: a checkpoint must cover everything sent.
func (s *Session) Checkpoint(seq uint64) error {
	if e := s.Err(); e != nil {
		return e
	}
	if seq != s.in.nextSeq-1 {
		return s.fail(errf(KindTornRecord, "checkpoint seq %d, last sequence number received %d", seq, s.in.nextSeq-1))
	}
	it := notice(kindCheckpoint, seq)
	it.at = time.Now()
	return s.enqueue(it)
}

// CheckClose validates CLOSE against what was received: the head of the last PUBLISH, the
// last sequence number taken, and the number of DROP notices.
func (s *Session) CheckClose(c Close) error {
	if e := s.Err(); e != nil {
		return e
	}
	switch {
	case c.Head != s.in.head:
		return s.fail(errf(KindBadRecord, "close head %d, last published head %d", c.Head, s.in.head))
	case c.Seq != s.in.nextSeq-1:
		return s.fail(errf(KindTornRecord, "close seq %d, last sequence number received %d", c.Seq, s.in.nextSeq-1))
	case c.Drops != s.in.dropsIn:
		return s.fail(errf(KindBadRecord, "close drops %d, DROP notices received %d", c.Drops, s.in.dropsIn))
	}
	return nil
}
