package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Span is an application's correlation span (a request id marked by
// llm_instrumentation.correlate) as attached to the snapshots it overlaps.
type Span struct {
	// CorrID is the application's id for the work (a request id).
	CorrID string `json:"corr_id"`
	// PID and TID are the process and thread that marked it.
	PID int `json:"pid"`
	TID int `json:"tid"`
	// Start and End are Unix seconds; End is nil while the span is open.
	Start float64  `json:"start"`
	End   *float64 `json:"end"`
}

// spanLine is one line of a spans file (docs/TRACE_FORMAT.md, "Correlation spans").
type spanLine struct {
	Event  string   `json:"event"`
	CorrID *string  `json:"corr_id"`
	PID    int      `json:"pid"`
	TID    int      `json:"tid"`
	T      *float64 `json:"t"`
}

// maxSpanLine bounds one line of a spans file; a longer one is an error, not a stall.
const maxSpanLine = 64 << 10

// ParseSpanLine decodes one spans-file line (without its newline).
func ParseSpanLine(b []byte) (event string, s Span, err error) {
	var l spanLine
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&l); err != nil {
		return "", s, fmt.Errorf("%w: %v", ErrBadSpan, err)
	}
	if dec.More() {
		return "", s, fmt.Errorf("%w: data after the object", ErrBadSpan)
	}
	if l.Event != "start" && l.Event != "end" {
		return "", s, fmt.Errorf("%w: event %q (want start or end)", ErrBadSpan, l.Event)
	}
	if l.CorrID == nil || *l.CorrID == "" {
		return "", s, fmt.Errorf("%w: no corr_id", ErrBadSpan)
	}
	if l.T == nil || math.IsNaN(*l.T) || math.IsInf(*l.T, 0) || *l.T < 0 {
		return "", s, fmt.Errorf("%w: bad or missing t", ErrBadSpan)
	}
	if l.PID <= 0 || l.TID <= 0 {
		return "", s, fmt.Errorf("%w: pid and tid must be positive", ErrBadSpan)
	}
	return l.Event, Span{CorrID: *l.CorrID, PID: l.PID, TID: l.TID, Start: *l.T}, nil
}

type spanKey struct {
	id       string
	pid, tid int
}

// SpanTail follows a spans file that applications append to and keeps the spans that may
// still overlap a future snapshot. It is not safe for concurrent use.
type SpanTail struct {
	path string
	off  int64
	open map[spanKey][]float64 // start times of open spans (nested spans of one id stack)
	done []Span                // closed spans not yet past
	// Bad counts lines that were skipped as malformed (see LastErr).
	Bad     uint64
	LastErr error
	// alive reports whether a process still exists: an open span of a process that is
	// gone can never end and is dropped.
	alive func(pid int) bool
}

func procAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// NewSpanTail follows path from its beginning or, without fromStart, from its current end
// (then a span already open is not seen, and its end is counted as malformed). A missing
// file is read once it appears. Spans that ended before the first interval are never
// attached; open spans of processes that are gone are dropped.
func NewSpanTail(path string, fromStart bool) (*SpanTail, error) {
	t := &SpanTail{path: path, open: map[spanKey][]float64{}, alive: procAlive}
	if !fromStart {
		fi, err := os.Stat(path)
		switch {
		case err == nil:
			t.off = fi.Size()
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("spans %s: %w", path, err)
		}
	}
	return t, nil
}

// Poll reads the whole lines appended since the last Poll. A partial last line is left for
// the next Poll; a file that shrank is read again from its start.
func (t *SpanTail) Poll() error {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("spans %s: %w", t.path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("spans %s: %w", t.path, err)
	}
	if fi.Size() < t.off {
		t.off = 0
		t.open = map[spanKey][]float64{}
	}
	if fi.Size() == t.off {
		return nil
	}
	// In bounded chunks: a long-lived server's spans file read from its start can be large.
	buf := make([]byte, spanChunk)
	for t.off < fi.Size() {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), fi.Size()-t.off)], t.off)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("spans %s: %w", t.path, err)
		}
		before := t.off
		t.Feed(buf[:n], &t.off)
		if t.off == before {
			return nil // a partial last line: wait for the rest
		}
	}
	return nil
}

// spanChunk is how much of the spans file Poll reads at once; larger than maxSpanLine, so
// every full chunk holds a whole line or is skipped as one too long.
const spanChunk = 1 << 20

// Feed consumes the whole lines at the start of data and advances *off by their length;
// a trailing partial line is left unless it exceeds the line limit, in which case it is
// skipped as malformed.
func (t *SpanTail) Feed(data []byte, off *int64) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(data) > maxSpanLine {
				t.bad(fmt.Errorf("%w: line longer than %d bytes", ErrBadSpan, maxSpanLine))
				*off += int64(len(data))
			}
			return
		}
		line := data[:i]
		data = data[i+1:]
		*off += int64(i + 1)
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		ev, s, err := ParseSpanLine(line)
		if err != nil {
			t.bad(err)
			continue
		}
		k := spanKey{s.CorrID, s.PID, s.TID}
		if ev == "start" {
			t.open[k] = append(t.open[k], s.Start)
			continue
		}
		starts := t.open[k]
		if len(starts) == 0 {
			t.bad(fmt.Errorf("%w: end of %q (pid %d tid %d) without a start", ErrBadSpan, s.CorrID, s.PID, s.TID))
			continue
		}
		end := s.Start
		s.Start = starts[len(starts)-1]
		if len(starts) == 1 {
			delete(t.open, k)
		} else {
			t.open[k] = starts[:len(starts)-1]
		}
		s.End = &end
		t.done = append(t.done, s)
	}
}

func (t *SpanTail) bad(err error) {
	t.Bad++
	t.LastErr = err
}

// Overlapping returns the spans that overlap [t0, t1] (open ones that started before t1
// included), sorted by start, and forgets closed spans that ended by t1: the next
// interval starts there.
func (t *SpanTail) Overlapping(t0, t1 float64) []Span {
	out := []Span{}
	keep := t.done[:0]
	for _, s := range t.done {
		if s.Start <= t1 && *s.End >= t0 {
			out = append(out, s)
		}
		if *s.End > t1 {
			keep = append(keep, s)
		}
	}
	t.done = keep
	for k, starts := range t.open {
		if t.alive != nil && !t.alive(k.pid) {
			delete(t.open, k)
			continue
		}
		for _, st := range starts {
			if st <= t1 {
				out = append(out, Span{CorrID: k.id, PID: k.pid, TID: k.tid, Start: st})
			}
		}
	}
	slices.SortFunc(out, func(a, b Span) int {
		if a.Start != b.Start {
			if a.Start < b.Start {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.CorrID, b.CorrID); c != 0 {
			return c
		}
		return a.TID - b.TID
	})
	return out
}
