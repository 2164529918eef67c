package stream

import (
	"encoding/json"
	"fmt"
)

// Prefix is what a walk of a stream prefix found.
type Prefix struct {
	// Packets and Tokens count the TENSOR/DROP/TOKEN packets and the TOKEN packets.
	Packets, Tokens uint64
	// Last is the last packet (nil when the prefix holds none).
	Last *PacketInfo
}

// CheckPrefix walks every packet of r, a Reader opened with the prefix's length as its
// size, and compares the prefix with e: it holds only TENSOR, DROP and TOKEN packets, ends
// on a packet boundary, has e.Packets of them, and its last one has seq e.LastSeq and CRC
// e.LastCRC, checked against the bytes too. A resumed session and checkpoint repair both
// rely on these facts, so both ask this one function. visit, when not nil, sees each
// packet. Each difference is one error wrapping ErrResumeMismatch; none means writing may
// continue at the prefix's end.
func CheckPrefix(r *Reader, e ResumeExpect, visit func(*PacketInfo)) (Prefix, []error) {
	return CheckPrefixFrom(r, r.header.DataOffset, Prefix{}, e, visit)
}

// CheckPrefixFrom is CheckPrefix for a prefix whose packets before start are known from
// elsewhere (an index journal, for a prefix freed after its upload): base counts them and
// names the last of them; the walk begins at start. The last packet's bytes are checked
// only when the walk read it.
func CheckPrefixFrom(r *Reader, start int64, base Prefix, e ResumeExpect, visit func(*PacketInfo)) (Prefix, []error) {
	var (
		pre  = base
		errs []error
	)
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(args, ErrResumeMismatch)...))
	}
	sc := r.ScanFrom(start, true)
	for sc.Next() {
		p := sc.Packet()
		switch p.Type {
		case TypeTensor, TypeDrop, TypeToken:
		default:
			bad("%v packet at offset %d inside the prefix (the capture had ended there)", p.Type, p.Offset)
		}
		pre.Packets++
		if p.Type == TypeToken {
			pre.Tokens++
		}
		if visit != nil {
			visit(p)
		}
		pre.Last = p
	}
	if err := sc.Err(); err != nil {
		bad("checkpointed offset %d is not on a packet boundary (not the end of a packet): %w", r.Size(), err)
	}
	if pre.Packets != e.Packets {
		bad("prefix holds %d packets, checkpoint says %d", pre.Packets, e.Packets)
	}
	last := pre.Last
	switch {
	case last == nil:
		if e.LastSeq != 0 {
			bad("prefix holds no packet, checkpoint says last seq %d", e.LastSeq)
		}
	case last.Seq != e.LastSeq:
		bad("last packet of the prefix has seq %d, checkpoint says %d", last.Seq, e.LastSeq)
	case last.CRC != e.LastCRC:
		bad("last packet (offset %d) has crc %#08x, checkpoint says %#08x", last.Offset, last.CRC, e.LastCRC)
	case last.Offset >= start:
		// The header field alone could be stale: check the bytes too.
		if _, _, err := r.ReadPacket(last.Offset); err != nil {
			bad("last packet of the prefix: %w", err)
		}
	}
	return pre, errs
}

// Intact is the end of the intact run of packets that follows a prefix: see IntactRun.
type Intact struct {
	// End is where the kept prefix ends: the end of Last, or the start of the walk when
	// the run holds no TOKEN packet.
	End int64
	// Packets, Drops and Tokens count the TENSOR/DROP/TOKEN, DROP and TOKEN packets from
	// the start of the walk to End.
	Packets, Drops, Tokens uint64
	// Forwards is one more than the largest forward counter of a TENSOR or DROP packet up
	// to End (0: none).
	Forwards uint64
	// Last is the last TOKEN packet of the run (nil: none, End is the start of the walk).
	Last *PacketInfo
}

// IntactRun walks from off, a packet boundary after which tokens TOKEN packets came
// before, while every packet reads whole, passes its CRC check and is a TENSOR, DROP or
// TOKEN packet whose TOKENs go on numbering tokens, tokens+1, ... It returns the end of
// the run's last TOKEN packet: every packet of each token's forward pass lies before it,
// so a resumed capture can go on there. r must be given the whole file's size.
func IntactRun(r *Reader, off int64, tokens uint64) Intact {
	run := Intact{End: off}
	var packets, drops, toks, forwards uint64
	for off < r.Size() {
		p, _, err := r.ReadPacket(off)
		if err != nil {
			break
		}
		switch p.Type {
		case TypeTensor, TypeDrop:
			if p.Type == TypeDrop {
				drops++
			}
			forwards = max(forwards, p.Forward+1)
		case TypeToken:
			if p.Step != tokens+toks {
				return run
			}
			toks++
		default:
			return run
		}
		packets++
		off += p.Len
		if p.Type == TypeToken {
			run = Intact{End: off, Packets: packets, Drops: drops, Tokens: toks, Forwards: forwards, Last: p}
		}
	}
	return run
}

// Ended is the END packet found after a resume point: see EndAfter.
type Ended struct {
	// Offset is where the END packet starts; Status is its meta's status.
	Offset int64
	Status string
	// Packets counts the TENSOR, DROP and TOKEN packets between the walk's start and it.
	Packets uint64
}

// EndAfter walks the packet headers from off, a packet boundary, to the END packet and
// returns it; ok is false when the walk reaches the end of r, a torn or unreadable packet
// or an INDEX first. r must be given the whole file's size. A resume at off of a stream
// whose END says "complete" would cut a finished capture: the resume paths refuse that
// unless told to (ErrComplete).
func EndAfter(r *Reader, off int64) (end Ended, ok bool) {
	for off < r.Size() {
		p, err := r.ReadHeader(off)
		if err != nil {
			return end, false
		}
		switch p.Type {
		case TypeEnd:
			var em EndMeta
			_ = json.Unmarshal(p.Meta, &em) // a bad meta has no status: not "complete"
			end.Offset, end.Status = p.Offset, em.Status
			return end, true
		case TypeIndex:
			return end, false
		}
		end.Packets++
		off += p.Len
	}
	return end, false
}

// CompleteAfter reports the END with status "complete" that follows off (see EndAfter).
func CompleteAfter(r *Reader, off int64) (Ended, bool) {
	e, ok := EndAfter(r, off)
	return e, ok && e.Status == "complete"
}
