package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// maxListed caps the gaps and problems a Report lists.
const maxListed = 100

// SeqRange is an inclusive range of missing sequence numbers.
type SeqRange struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

// Report is what Verify found.
type Report struct {
	// Size is the file size.
	Size int64 `json:"size"`
	// OK: every packet's header, bounds and CRC are valid, sequence numbers run 1..N with
	// no gap or repeat, and END, INDEX and footer are present and agree with the packets.
	OK bool `json:"ok"`
	// Packets counts every valid packet walked, END and INDEX included.
	Packets uint64 `json:"packets"`
	// Tensors, Drops and Tokens count packets by type.
	Tensors uint64 `json:"tensors"`
	Drops   uint64 `json:"drops"`
	Tokens  uint64 `json:"tokens"`
	// FirstBadOffset is the offset of the first invalid byte range, -1 when none.
	FirstBadOffset int64 `json:"first_bad_offset"`
	// Error describes what is wrong at FirstBadOffset.
	Error string `json:"error,omitempty"`
	// Truncated: the file ends inside a header or packet, at FirstBadOffset.
	Truncated bool `json:"truncated"`
	// ValidUntil is the end of the last valid packet (every byte before it can be read).
	ValidUntil int64 `json:"valid_until"`
	// HasEnd, HasIndex, HasFooter: the closing packets seen.
	HasEnd    bool `json:"has_end"`
	HasIndex  bool `json:"has_index"`
	HasFooter bool `json:"has_footer"`
	// End is the END packet's meta, when present.
	End *EndMeta `json:"end,omitempty"`
	// IndexConsistent: the INDEX lists exactly the packets walked and the footer points at it.
	IndexConsistent bool `json:"index_consistent"`
	// LastSeq is the highest sequence number seen.
	LastSeq uint64 `json:"last_seq"`
	// SeqGaps lists missing sequence numbers (first maxListed ranges).
	SeqGaps []SeqRange `json:"seq_gaps,omitempty"`
	// SeqRepeats counts packets whose seq is not above every earlier one.
	SeqRepeats uint64 `json:"seq_repeats"`
	// Problems lists every problem found, first the one at FirstBadOffset.
	Problems []string `json:"problems,omitempty"`
}

func (rep *Report) problem(format string, args ...any) {
	if len(rep.Problems) < maxListed {
		rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...))
	}
}

// Verify walks every packet of the stream in r, checking every header and CRC, the
// sequence numbers, END, INDEX and footer. It never fails: what it finds is in the Report.
func Verify(r io.ReaderAt, size int64) Report {
	rep := Report{Size: size, FirstBadOffset: -1}
	rd, err := NewReader(r, size)
	if err != nil {
		rep.fail(err, 0)
		return rep
	}
	rep.ValidUntil = rd.header.DataOffset
	var walked []IndexEntry
	var endCounts struct{ packets, drops uint64 }
	s := rd.Scan(false)
	for s.Next() {
		p := s.Packet()
		rep.Packets++
		rep.ValidUntil = p.Offset + p.Len
		if rep.HasEnd && p.Type != TypeIndex {
			rep.problem("%v packet at offset %d after END", p.Type, p.Offset)
		}
		switch p.Type {
		case TypeTensor, TypeDrop, TypeToken:
			switch p.Type {
			case TypeTensor:
				rep.Tensors++
			case TypeDrop:
				rep.Drops++
			case TypeToken:
				rep.Tokens++
			}
			if rep.HasEnd {
				break
			}
			endCounts.packets++
			if p.Type == TypeDrop {
				endCounts.drops++
			}
			walked = append(walked, p.entry())
			switch {
			case p.Seq > rep.LastSeq+1:
				if len(rep.SeqGaps) < maxListed {
					rep.SeqGaps = append(rep.SeqGaps, SeqRange{From: rep.LastSeq + 1, To: p.Seq - 1})
				}
				rep.problem("seq %d..%d missing before offset %d", rep.LastSeq+1, p.Seq-1, p.Offset)
				rep.LastSeq = p.Seq
			case p.Seq <= rep.LastSeq:
				rep.SeqRepeats++
				rep.problem("seq %d at offset %d repeats or goes back (last %d)", p.Seq, p.Offset, rep.LastSeq)
			default:
				rep.LastSeq = p.Seq
			}
		case TypeEnd:
			if rep.HasEnd {
				rep.problem("second END at offset %d", p.Offset)
				break
			}
			rep.HasEnd = true
			var em EndMeta
			if err := json.Unmarshal(p.Meta, &em); err != nil {
				rep.problem("END meta at offset %d: %v", p.Offset, err)
			} else {
				rep.End = &em
				switch em.Status {
				case "complete", "aborted", "error":
				default:
					rep.problem("END status %q", em.Status)
				}
			}
		case TypeIndex:
			rep.HasIndex = true
			if !rep.HasEnd {
				rep.problem("INDEX at offset %d without END before it", p.Offset)
			}
			entries, err := parseIndex(s.Payload(), p.Offset)
			if err != nil {
				rep.problem("%v", err)
				break
			}
			rep.IndexConsistent = slices.EqualFunc(entries, walked, sameEntry)
			if !rep.IndexConsistent {
				rep.problem("INDEX at offset %d does not list the %d packets walked", p.Offset, len(walked))
			}
		}
	}
	if err := s.Err(); err != nil {
		rep.fail(err, s.Offset())
		if _, ferr := rd.Footer(); rep.Truncated && ferr == nil {
			// The file still ends in a footer: a length field lies, nothing was cut.
			rep.Truncated = false
			rep.Problems[0] = fmt.Sprintf("bad data at offset %d: %v (file has a footer, so not a cut)", rep.FirstBadOffset, err)
		}
	}
	rep.HasFooter = s.Footer()
	if rep.HasFooter {
		rep.ValidUntil = size
		idx, err := rd.Footer()
		if err != nil || idx != s.indexOff {
			rep.IndexConsistent = false
			rep.problem("footer index_offset does not point at the INDEX packet (%d)", s.indexOff)
		}
	}
	if rep.End != nil {
		if rep.End.Packets != endCounts.packets {
			rep.problem("END says %d packets, stream has %d", rep.End.Packets, endCounts.packets)
		}
		if rep.End.Drops != endCounts.drops {
			rep.problem("END says %d drops, stream has %d", rep.End.Drops, endCounts.drops)
		}
	}
	if rep.FirstBadOffset < 0 {
		switch {
		case !rep.HasEnd:
			rep.problem("no END packet: the stream was cut at offset %d", rep.ValidUntil)
		case !rep.HasIndex || !rep.HasFooter:
			rep.problem("no INDEX/footer after END")
		}
	}
	rep.OK = len(rep.Problems) == 0
	return rep
}

// fail records the error that stopped the walk.
func (rep *Report) fail(err error, off int64) {
	var oe *OffsetError
	if errors.As(err, &oe) {
		off = oe.Offset
	}
	rep.FirstBadOffset = off
	rep.Truncated = errors.Is(err, ErrTruncated)
	rep.Error = err.Error()
	if rep.Truncated {
		rep.problem("truncated at offset %d: %v", off, err)
	} else {
		rep.problem("bad data at offset %d: %v", off, err)
	}
}

// VerifyFile opens path and verifies it; the error is only for failing to open or stat it.
func VerifyFile(path string) (Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return Report{}, fmt.Errorf("open stream: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Report{}, fmt.Errorf("stat stream: %w", err)
	}
	return Verify(f, st.Size()), nil
}

// WriteText prints the report for people.
func (rep *Report) WriteText(w io.Writer) error {
	state := "OK"
	switch {
	case rep.Truncated:
		state = fmt.Sprintf("TRUNCATED at offset %d", rep.FirstBadOffset)
	case rep.FirstBadOffset >= 0:
		state = fmt.Sprintf("DAMAGED at offset %d", rep.FirstBadOffset)
	case !rep.OK:
		state = "INCOMPLETE"
	}
	fmt.Fprintf(w, "%s\n", state)
	fmt.Fprintf(w, "size %d bytes, valid until %d; %d packets: %d tensor, %d drop, %d token\n",
		rep.Size, rep.ValidUntil, rep.Packets, rep.Tensors, rep.Drops, rep.Tokens)
	fmt.Fprintf(w, "end %v, index %v, footer %v, index consistent %v, last seq %d\n",
		rep.HasEnd, rep.HasIndex, rep.HasFooter, rep.IndexConsistent, rep.LastSeq)
	if rep.End != nil {
		fmt.Fprintf(w, "end status %s (packets %d, drops %d)", rep.End.Status, rep.End.Packets, rep.End.Drops)
		if rep.End.Error != "" {
			fmt.Fprintf(w, ": %s", rep.End.Error)
		}
		fmt.Fprintln(w)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
	_, err := fmt.Fprint(w)
	return err
}
