package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/resevent"
)

// ResourceSuffix is appended to a session's output path to name its resource-event log.
const ResourceSuffix = ".resources.jsonl"

// Bounds on reading a log written by another process.
const (
	// maxLineBytes is the longest resource-event line read; a longer one is reported as
	// malformed and skipped to its end.
	maxLineBytes = 1 << 20
	// maxReadPerPoll bounds what one poll reads from one file, so one huge log cannot hold
	// a request (the next poll continues where this one stopped).
	maxReadPerPoll = 4 << 20
)

// Filter selects resource events; zero fields select everything.
type Filter struct {
	// Event keeps lines whose "event" equals it.
	Event string
	// Layer keeps lines whose "layer_id" (or, on lines without one, "layer"), a string or
	// a number compared as written, equals it.
	Layer string
	// SinceUS keeps lines whose "timestamp" (Unix microseconds) is at or after it; lines
	// without a timestamp are left out when it is set.
	SinceUS  int64
	HasSince bool
}

// resourceLine is what the API reads of one line: the filter fields and the line itself.
type resourceLine struct {
	Event       string
	Layer       string
	HasLayer    bool
	TimestampUS int64 // Unix microseconds
	HasTS       bool
	Raw         json.RawMessage
}

// parseResourceLine reads the fields the filters use with resevent (the one Go reader of
// an event's common fields); the line itself is passed through untouched.
func parseResourceLine(b []byte) (resourceLine, error) {
	b = bytes.TrimSpace(b)
	e, err := resevent.Parse(b)
	if err != nil {
		return resourceLine{}, err
	}
	l := resourceLine{Event: e.Name(), Raw: json.RawMessage(b)}
	if l.Layer, l.HasLayer, err = e.Layer(); err != nil {
		return resourceLine{}, err
	}
	if l.TimestampUS, l.HasTS, err = e.TimestampUS(); err != nil {
		return resourceLine{}, err
	}
	return l, nil
}

func (f *Filter) match(l *resourceLine) bool {
	if f.Event != "" && l.Event != f.Event {
		return false
	}
	if f.Layer != "" && (!l.HasLayer || l.Layer != f.Layer) {
		return false
	}
	if f.HasSince && (!l.HasTS || l.TimestampUS < f.SinceUS) {
		return false
	}
	return true
}

// parseSince reads since= as RFC 3339 or as Unix seconds, and returns Unix microseconds.
func parseSince(s string) (int64, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		// 9.2e12 s is past what int64 microseconds hold.
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 9e12 {
			return 0, fmt.Errorf("since %q: want a non-negative number of Unix seconds or an RFC 3339 time", s)
		}
		return int64(math.Round(v * 1e6)), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("since %q: want an RFC 3339 time (2026-11-26T02:00:00Z) or Unix seconds", s)
	}
	if t.Unix() < 0 {
		return 0, fmt.Errorf("since %q: before 1970", s)
	}
	return t.UnixMicro(), nil
}

// Event is one resource event as the API returns it.
type Event struct {
	// Session is the capture session whose log holds the line.
	Session uint64 `json:"session"`
	// Line is the line's number in the log, from 1.
	Line int `json:"line"`
	// Event is the line itself, unchanged.
	Event json.RawMessage `json:"event"`
}

// Malformed is a line the API could not read: reported, never dropped silently.
type Malformed struct {
	Session uint64 `json:"session"`
	Line    int    `json:"line"`
	Error   string `json:"error"`
}

// tailer reads one session's resource log in whole lines from where it stopped.
type tailer struct {
	session uint64
	uid     uint32
	path    string
	f       *os.File
	off     int64
	line    int
	partial []byte // a line not yet ended by '\n'
	long    bool   // inside a line longer than maxLineBytes, skipping to its end
	buf     []byte // read buffer, kept across polls
}

func newTailer(session uint64, uid uint32, output string) *tailer {
	return &tailer{session: session, uid: uid, path: output + ResourceSuffix}
}

// errNotAbsolute: the session's output_path is a label the daemon cannot resolve.
var errNotAbsolute = errors.New("output_path is not an absolute path, so its resource log cannot be found")

// open opens the log when it exists. The path comes from the client's OPEN metadata, so
// the file must be a regular file owned by the session's uid (root's sessions excepted),
// reached without following a symlink at its last component: the daemon, often root,
// never reads for a peer a file that peer's session did not write.
func (t *tailer) open() error {
	if t.f != nil {
		return nil
	}
	if !filepath.IsAbs(t.path) {
		return errNotAbsolute
	}
	fd, err := unix.Open(t.path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: t.path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "fstat", Path: t.path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return fmt.Errorf("%s: not a regular file", t.path)
	}
	if t.uid != 0 && st.Uid != t.uid {
		unix.Close(fd)
		return fmt.Errorf("%s: owned by uid %d, not by the session's uid %d", t.path, st.Uid, t.uid)
	}
	t.f = os.NewFile(uintptr(fd), t.path)
	return nil
}

func (t *tailer) close() {
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// skipToEnd moves past everything already in the file, so a follower sees only lines
// written after it connected (line numbers still count the skipped lines).
func (t *tailer) skipToEnd() error {
	if err := t.open(); err != nil {
		return err
	}
	fi, err := t.f.Stat()
	if err != nil {
		return err
	}
	for t.off < fi.Size() {
		before := t.off
		if err := t.poll(nil, nil, &Filter{}); err != nil {
			return err
		}
		if t.off == before {
			break
		}
	}
	return nil
}

// poll reads what was appended since the last poll (up to maxReadPerPoll) and calls
// onEvent for each whole line that matches f and onBad for each that cannot be read. A
// file that shrank (truncated and rewritten) is read again from the start.
func (t *tailer) poll(onEvent func(Event), onBad func(Malformed), f *Filter) error {
	if err := t.open(); err != nil {
		return err
	}
	if fi, err := t.f.Stat(); err == nil && fi.Size() < t.off {
		t.off, t.line, t.partial, t.long = 0, 0, nil, false
	}
	if t.buf == nil {
		t.buf = make([]byte, 64<<10)
	}
	buf := t.buf
	for read := 0; read < maxReadPerPoll; {
		n, err := t.f.ReadAt(buf, t.off)
		read += n
		t.off += int64(n)
		chunk := buf[:n]
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				t.keep(chunk)
				break
			}
			t.keep(chunk[:i])
			chunk = chunk[i+1:]
			t.line++
			if t.long {
				t.long = false
				if onBad != nil {
					onBad(Malformed{Session: t.session, Line: t.line, Error: fmt.Sprintf("line longer than %d bytes", maxLineBytes)})
				}
				continue
			}
			line := t.partial
			t.partial = nil
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			l, perr := parseResourceLine(line)
			if perr != nil {
				if onBad != nil {
					onBad(Malformed{Session: t.session, Line: t.line, Error: perr.Error()})
				}
				continue
			}
			if f.match(&l) && onEvent != nil {
				onEvent(Event{Session: t.session, Line: t.line, Event: l.Raw})
			}
		}
		if err == io.EOF || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", t.path, err)
		}
	}
	return nil
}

// keep adds b to the line being assembled, switching to skipping once it is too long.
func (t *tailer) keep(b []byte) {
	if t.long || len(b) == 0 {
		return
	}
	if len(t.partial)+len(b) > maxLineBytes {
		t.partial, t.long = nil, true
		return
	}
	t.partial = append(t.partial, b...)
}

// pending reports whether the file ends in a line not yet terminated.
func (t *tailer) pending() bool { return len(t.partial) > 0 || t.long }

// describeOpenErr says why a log could not be read, for the response's sources.
func describeOpenErr(err error) string {
	if errors.Is(err, os.ErrNotExist) {
		return "no resource log (yet)"
	}
	return strings.TrimSpace(err.Error())
}
