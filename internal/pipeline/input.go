package pipeline

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/codec"
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
// them. seq is the last record's sequence number in the window (a tensor's, or a TOKEN
// record's). It returns the
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
	var (
		last uint64
		b    batch
	)
	for in.rd.Pos() < head {
		it, _, err := s.takeNext(head)
		if err != nil {
			s.flush(&b) // what was taken before it is good and is written
			return s.fail(err)
		}
		if it == nil {
			continue
		}
		last = it.seq
		if err := s.route(&b, it); err != nil {
			return err
		}
	}
	if err := s.flush(&b); err != nil {
		return err
	}
	if last != 0 && last != seq {
		return s.fail(errf(KindTornRecord, "publish says last seq %d, window ends with record seq %d", seq, last))
	}
	return nil
}

// takeNext parses the record at the reader's position in the window ending at end and
// checks it (its sequence number, its meta): the one step of Publish and DrainPublished.
// A record that passes is taken: its ring bytes are tracked until freed, the next
// sequence number moves on, and it comes back as an item for route. Padding is taken and
// comes back nil. A record that fails is not taken. next is where the record ends.
func (s *Session) takeNext(end uint64) (it *item, next uint64, err error) {
	in := &s.in
	rec, pos, err := in.rd.Next(end)
	if err != nil {
		return nil, 0, &Error{Kind: KindBadRecord, Err: err}
	}
	next = pos + rec.Len
	if rec.Kind == shm.KindPad {
		s.tail.free(s.tail.add(next))
		return nil, next, nil
	}
	if rec.Seq != in.nextSeq {
		return nil, 0, errf(KindTornRecord, "record at position %d has seq %d, expected %d", pos, rec.Seq, in.nextSeq)
	}
	if rec.Kind == shm.KindToken {
		// The text is copied out, so the record's ring bytes are free at once; the TOKEN
		// packet is written in sequence order with the records around it (route).
		pos := rec.Position()
		t := Token{Seq: rec.Seq, Index: rec.Step, TokenID: rec.TokenID(), Text: string(rec.Payload), Position: &pos}
		s.tail.free(s.tail.add(next))
		in.nextSeq++
		if s.o.Observer != nil {
			s.o.Observer.ObserveToken(s.o.ID, time.Now())
		}
		it := newMember()
		*it = item{kind: kindToken, seq: t.Seq, tok: t, done: closedDone}
		return it, next, nil
	}
	var meta []byte
	if len(rec.Meta) > 0 {
		// Copied: the client may reuse the bytes once released.
		meta = append([]byte(nil), rec.Meta...)
		if err := metaObject(meta); err != nil {
			return nil, 0, errf(KindBadRecord, "record seq %d: meta is not a JSON object: %v", rec.Seq, err)
		}
	}
	var coded *codec.FP8Coded
	if rec.Flags&shm.FlagFP8 != 0 {
		if rec.FP8.Status != 0 {
			// The client found values e4m3 cannot carry (strapd's own encoder would have
			// stored the block losslessly) and sent no codes: the record becomes a DROP
			// notice that says why, not a packet that differs from the encoder's.
			in.nextSeq++
			s.tail.free(s.tail.add(next))
			it := notice(kindDrop, rec.Seq)
			it.drop = Drop{Seq: rec.Seq, Name: rec.Name, Step: rec.Step, Forward: rec.Forward, Bytes: rec.TensorLen,
				Reason: fp8DropReason(rec.FP8.Status)}
			return it, next, nil
		}
		if coded, err = s.fp8Coded(&rec); err != nil {
			return nil, 0, err
		}
	}
	in.nextSeq++
	s.bytesIn.Add(uint64(len(rec.Payload)))
	it = newMember()
	*it = item{kind: kindTensor, seq: rec.Seq, rec: rec, meta: meta, coded: coded}
	it.span = s.tail.addTo(&it.spanv, next)
	return it, next, nil
}

// fp8Coded checks an FP8 record against the session (codec fp8, the client's blocks are
// the session's) and readies the building of its blocks.
func (s *Session) fp8Coded(rec *shm.Record) (*codec.FP8Coded, error) {
	lc, ok := s.codec.(codec.LossyCodec)
	if s.codec == nil || s.codec.ID() != codec.FP8 || !ok {
		name := "none"
		if s.codec != nil {
			name = s.codec.Name()
		}
		return nil, errf(KindBadRecord, "record seq %d (%s): an FP8 record in a session whose codec is %s, not fp8", rec.Seq, rec.Name, name)
	}
	w := uint64(rec.DType.Size())
	if uint64(s.bs)%w != 0 || rec.FP8.BlockValues != uint64(s.bs)/w {
		return nil, errf(KindBadRecord, "record seq %d (%s): FP8 record cut into blocks of %d values, the session's blocks of %d bytes hold %d values of %s",
			rec.Seq, rec.Name, rec.FP8.BlockValues, s.bs, uint64(s.bs)/w, rec.DType)
	}
	n := rec.TensorLen / w
	c, err := codec.NewFP8Coded(rec.DType, int(n), int(shm.FP8RowLen(rec.Shape, n)), int(rec.FP8.BlockValues),
		lc.Bound().Value, rec.FP8.Scales, rec.FP8.Sums, rec.FP8.Codes)
	if err != nil {
		return nil, errf(KindBadRecord, "record seq %d (%s): %v", rec.Seq, rec.Name, err)
	}
	return c, nil
}

// fp8DropReason is the DROP reason of an FP8 record whose client found values it could not
// code (PROTOCOL.md 2, "FP8 records").
func fp8DropReason(status uint32) string {
	switch {
	case status&shm.FP8NonFinite != 0:
		return "fp8_nonfinite"
	case status&shm.FP8TinyScale != 0:
		return "fp8_tiny_scale"
	default:
		return "fp8_over_bound"
	}
}

// metaObject checks that meta decodes as a JSON object (or null), as json.Unmarshal into
// a map takes it. The common case, valid JSON starting with '{', is checked by json.Valid,
// which does not allocate; anything else is decoded, for the verdict and its words.
func metaObject(meta []byte) error {
	if t := bytes.TrimLeft(meta, " \t\r\n"); len(t) > 0 && t[0] == '{' && json.Valid(meta) {
		return nil
	}
	var obj map[string]json.RawMessage
	return json.Unmarshal(meta, &obj)
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
	// json.Marshal of the DROP meta would turn invalid UTF-8 into U+FFFD without a word.
	if !utf8.ValidString(d.Name) || !utf8.ValidString(d.Reason) {
		return s.fail(errf(KindBadRequest, "drop seq %d: name %q or reason %q is not valid UTF-8", d.Seq, d.Name, d.Reason))
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
	// The text goes into the TOKEN meta through json.Marshal, which would write invalid
	// UTF-8 as U+FFFD: the stream would hold a text the client never sent.
	if !utf8.ValidString(t.Text) {
		return s.fail(errf(KindBadRequest, "token seq %d: text %q is not valid UTF-8", t.Seq, t.Text))
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

// DrainPublished takes, after the client died (EOF without CLOSE), the records it finished
// but had not yet named in a PUBLISH or TOKEN: those in [previous head, cursor), where cursor
// is the ring's published cursor (PROTOCOL.md 1.4, "Client death"). The client stores the
// cursor only once every record below it is complete, so each of them is parsed and queued
// with the checks of Publish. A record that fails them ends the drain and is not queued,
// and the session does not fail for it: everything queued before it is written as usual.
// A cursor of 0, at the previous head or below it is nothing to take; one that lies
// outside the ring's window is refused as a whole. It returns the number of records taken
// and why the drain stopped early (nil when it took the whole window).
func (s *Session) DrainPublished() (int, error) {
	if s.Err() != nil {
		return 0, nil
	}
	in := &s.in
	cur := s.o.Ring.Published()
	if cur <= in.head {
		return 0, nil
	}
	if cur%shm.Align != 0 {
		return 0, errf(KindBadRecord, "published cursor %d is not a multiple of %d", cur, shm.Align)
	}
	tail := s.tail.current()
	if ds := s.o.Ring.DataSize(); cur-tail > ds {
		return 0, errf(KindBadRecord, "published cursor %d is more than data_size %d past tail %d", cur, ds, tail)
	}
	n := 0
	var b batch
	for in.rd.Pos() < cur {
		it, next, err := s.takeNext(cur)
		if err != nil {
			if ferr := s.flush(&b); ferr != nil {
				return n, ferr
			}
			return n, err
		}
		// Taken: the head moves past it, as a PUBLISH ending here would have moved it.
		in.head = next
		s.headA.Store(next)
		if it == nil {
			continue
		}
		if err := s.route(&b, it); err != nil {
			return n, err
		}
		n++
	}
	return n, s.flush(&b)
}
