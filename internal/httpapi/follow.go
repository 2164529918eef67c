package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/control"
)

// ResourceLogReply is the body of /api/v1/resource-logs without follow.
type ResourceLogReply struct {
	// Events are the matching lines, session by session, in file order.
	Events []Event `json:"events"`
	// Malformed are the lines that could not be read.
	Malformed []Malformed `json:"malformed"`
	// Sources says, per session read, which file was read and what went wrong.
	Sources []Source `json:"sources"`
	// Truncated is true when limit stopped the reading; ask again with a later since.
	Truncated bool `json:"truncated"`
}

// Source is one session's resource log as the request saw it.
type Source struct {
	Session uint64 `json:"session"`
	Path    string `json:"path"`
	// Lines is how many whole lines were read.
	Lines int `json:"lines"`
	// Error is why the log could not be read (absent: it was).
	Error string `json:"error,omitempty"`
	// IncompleteTail is true when the file ends in a line still being written; it is
	// read by a later request once its newline arrives.
	IncompleteTail bool `json:"incomplete_tail,omitempty"`
}

// logRequest is a parsed /api/v1/resource-logs query.
type logRequest struct {
	filter Filter
	only   uint64 // 0: every session the peer may see
	follow bool
	limit  int
}

func parseLogRequest(w http.ResponseWriter, r *http.Request) (logRequest, bool) {
	if !checkParams(w, r, "session", "event", "layer", "since", "follow", "limit") {
		return logRequest{}, false
	}
	q := r.URL.Query()
	lr := logRequest{filter: Filter{Event: q.Get("event"), Layer: q.Get("layer")}, limit: defaultLimit}
	bad := func(msg string) (logRequest, bool) {
		writeError(w, http.StatusBadRequest, "bad_request", msg)
		return logRequest{}, false
	}
	if q.Has("since") {
		v, err := parseSince(q.Get("since"))
		if err != nil {
			return bad(err.Error())
		}
		lr.filter.SinceUS, lr.filter.HasSince = v, true
	}
	switch q.Get("follow") {
	case "", "0":
	case "1":
		lr.follow = true
	default:
		return bad(fmt.Sprintf("follow %q: want 0 or 1", q.Get("follow")))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return bad(fmt.Sprintf("limit %q: want 1..%d", v, maxLimit))
		}
		if lr.follow {
			return bad("limit applies to a read, not to follow=1")
		}
		lr.limit = n
	}
	if q.Has("session") {
		id, ok := parseID(w, q.Get("session"))
		if !ok {
			return logRequest{}, false
		}
		lr.only = id
	}
	return lr, true
}

// selected are the sessions of st the request names.
func (lr *logRequest) selected(st control.StatusReply) []control.SessionStatus {
	if lr.only == 0 {
		return st.Sessions
	}
	if s, ok := findSession(st, lr.only); ok {
		return []control.SessionStatus{s}
	}
	return nil
}

func (h *Handler) resourceLogs(w http.ResponseWriter, r *http.Request) {
	lr, ok := parseLogRequest(w, r)
	if !ok {
		return
	}
	st := h.opts.Backend.Status(h.peer(r))
	sessions := lr.selected(st)
	if lr.only != 0 && len(sessions) == 0 {
		writeError(w, http.StatusNotFound, "unknown_session", fmt.Sprintf(errUnknownSession, lr.only))
		return
	}
	if lr.follow {
		h.follow(w, r, lr, sessions)
		return
	}
	out := ResourceLogReply{Events: []Event{}, Malformed: []Malformed{}, Sources: []Source{}}
	for _, s := range sessions {
		t := newTailer(s.Session, s.UID, s.OutputPath)
		src := Source{Session: s.Session, Path: t.path}
		err := t.open()
		for err == nil && !out.Truncated {
			before := t.off
			err = t.poll(func(e Event) {
				if len(out.Events) >= lr.limit {
					out.Truncated = true
					return
				}
				out.Events = append(out.Events, e)
			}, func(m Malformed) { out.Malformed = append(out.Malformed, m) }, &lr.filter)
			if t.off == before {
				break
			}
		}
		if err != nil {
			src.Error = describeOpenErr(err)
		}
		src.Lines, src.IncompleteTail = t.line, t.pending()
		t.close()
		out.Sources = append(out.Sources, src)
	}
	writeJSON(w, http.StatusOK, out)
}

// follow streams matching lines as Server-Sent Events: lines written after the request
// (with since=, the earlier lines at or after since first), from every selected session
// and, without session=, from sessions the peer opens later. A session that ends gets a
// session_end event; with session= that ends the stream.
func (h *Handler) follow(w http.ResponseWriter, r *http.Request, lr logRequest, sessions []control.SessionStatus) {
	if n := h.followers.Add(1); int(n) > h.opts.MaxFollowers {
		h.followers.Add(-1)
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too_many_followers",
			fmt.Sprintf("%d resource-log streams are open, the most this strapd serves; retry later", h.opts.MaxFollowers))
		return
	}
	defer h.followers.Add(-1)
	rc := http.NewResponseController(w)
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, rc: rc}

	p := h.peer(r)
	tails := map[uint64]*tailer{}
	reported := map[uint64]string{}
	defer func() {
		for _, t := range tails {
			t.close()
		}
	}()
	add := func(s control.SessionStatus, fromStart bool) {
		t := newTailer(s.Session, s.UID, s.OutputPath)
		tails[s.Session] = t
		if !fromStart {
			// Only lines written after the client connected; a log that does not exist
			// yet is read from its first line when it appears.
			if err := t.skipToEnd(); err != nil && !errors.Is(err, os.ErrNotExist) {
				h.reportSource(sse, reported, t, err)
			}
		}
	}
	for _, s := range sessions {
		add(s, lr.filter.HasSince)
	}
	// Sent once every log is positioned: a line written after the client read this
	// comment is delivered.
	sse.comment("following resource logs")
	tick := time.NewTicker(h.opts.Poll)
	defer tick.Stop()
	lastWrite := time.Now()
	for {
		for id, t := range tails {
			err := t.poll(func(e Event) { sse.event("resource", fmt.Sprintf("%d:%d", e.Session, e.Line), e) },
				func(m Malformed) { sse.event("malformed", "", m) }, &lr.filter)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				h.reportSource(sse, reported, t, err)
			} else if err == nil {
				delete(reported, id)
			}
		}
		if sse.err != nil {
			h.opts.Log.Debug("resource-log follower gone", zap.Error(sse.err))
			return
		}
		if sse.wrote {
			sse.flush()
			sse.wrote = false
			lastWrite = time.Now()
		} else if time.Since(lastWrite) >= h.opts.Heartbeat {
			sse.comment("keepalive")
			lastWrite = time.Now()
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
		live := lr.selected(h.opts.Backend.Status(p))
		now := map[uint64]bool{}
		for _, s := range live {
			now[s.Session] = true
			if tails[s.Session] == nil {
				add(s, true) // opened after the request: every line is new
			}
		}
		for id, t := range tails {
			if now[id] {
				continue
			}
			// Ended: read what it wrote last, then say so.
			_ = t.poll(func(e Event) { sse.event("resource", fmt.Sprintf("%d:%d", e.Session, e.Line), e) },
				func(m Malformed) { sse.event("malformed", "", m) }, &lr.filter)
			sse.event("session_end", "", map[string]uint64{"session": id})
			t.close()
			delete(tails, id)
			if lr.only == id {
				sse.flush()
				return
			}
		}
	}
}

// reportSource sends a source_error event once per distinct error of a session's log.
func (h *Handler) reportSource(sse *sseWriter, reported map[uint64]string, t *tailer, err error) {
	msg := describeOpenErr(err)
	if reported[t.session] == msg {
		return
	}
	reported[t.session] = msg
	sse.event("source_error", "", Source{Session: t.session, Path: t.path, Lines: t.line, Error: msg})
}

// sseWriter writes Server-Sent Events and remembers the first write error.
type sseWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	wrote bool
	err   error
}

func (s *sseWriter) event(name, id string, v any) {
	if s.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	msg := "event: " + name + "\n"
	if id != "" {
		msg += "id: " + id + "\n"
	}
	// A JSON value marshalled by encoding/json holds no raw newline, so one data line.
	msg += "data: " + string(b) + "\n\n"
	_, s.err = s.w.Write([]byte(msg))
	s.wrote = true
}

func (s *sseWriter) comment(c string) {
	if s.err != nil {
		return
	}
	_, s.err = s.w.Write([]byte(": " + c + "\n\n"))
	s.flush()
}

func (s *sseWriter) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}
