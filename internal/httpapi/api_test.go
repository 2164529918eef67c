package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// fakeBackend answers like the daemon: root sees every session, others their own; uids
// in refuse are turned away as an allow-list would.
type fakeBackend struct {
	mu       sync.Mutex
	sessions []control.SessionStatus
	refuse   map[uint32]bool
}

func (f *fakeBackend) Admit(p *Peer) error {
	if f.refuse[p.Cred.Uid] {
		return fmt.Errorf("access denied: uid %d is not on this daemon's allow-lists", p.Cred.Uid)
	}
	return nil
}

func (f *fakeBackend) Status(p *Peer) control.StatusReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep := control.StatusReply{Daemon: control.DaemonStatus{PID: 1, Sessions: len(f.sessions)}}
	for _, s := range f.sessions {
		if p.Root() || p.Cred.Uid == s.UID {
			rep.Sessions = append(rep.Sessions, s)
		}
	}
	return rep
}

func (f *fakeBackend) set(s ...control.SessionStatus) {
	f.mu.Lock()
	f.sessions = s
	f.mu.Unlock()
}

type apiServer struct {
	sock string
	be   *fakeBackend
	h    *Handler
}

// startAPI serves a Handler on a fresh Unix socket (mode 0666 so other uids can reach it
// and be judged by the handler).
func startAPI(t *testing.T, be *fakeBackend, o Options) *apiServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "strap-api")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	ln, err := Listen(sock, 0o666, 0)
	if err != nil {
		t.Fatal(err)
	}
	o.Backend = be
	h := NewHandler(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &apiServer{sock: sock, be: be, h: h}
}

// client dials the socket for every request; dial, when set, makes the connection.
func (a *apiServer) client(dial func() (net.Conn, error)) *http.Client {
	if dial == nil {
		dial = func() (net.Conn, error) { return net.Dial("unix", a.sock) }
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return dial() },
		DisableKeepAlives: true,
	}}
}

func get(t *testing.T, c *http.Client, path string) (int, []byte) {
	t.Helper()
	resp, err := c.Get("http://strapd" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func TestStatusAndSessions(t *testing.T) {
	be := &fakeBackend{}
	be.set(control.SessionStatus{Session: 3, UID: 0, PID: 10, Codec: "none"},
		control.SessionStatus{Session: 5, UID: 1000, PID: 11, Codec: "zstd"})
	a := startAPI(t, be, Options{})
	c := a.client(nil)
	tests := []struct {
		name, path string
		code       int
		want       string
	}{
		{"status", "/api/v1/status", 200, `"sessions": [`},
		{"sessions", "/api/v1/sessions", 200, `"hidden": 0`},
		{"one session", "/api/v1/sessions/5", 200, `"codec": "zstd"`},
		{"unknown session", "/api/v1/sessions/99", 404, `"code": "unknown_session"`},
		{"malformed id", "/api/v1/sessions/abc", 400, `session id \"abc\"`},
		{"zero id", "/api/v1/sessions/0", 400, `want a positive integer`},
		{"unknown parameter", "/api/v1/status?verbose=1", 400, `unknown query parameter \"verbose\"`},
		{"no such endpoint", "/api/v2/status", 404, `"code": "not_found"`},
		{"trace without probes", "/api/v1/trace", 503, `"code": "no_probes"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, c, tc.path)
			if code != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("GET %s: %d %s; want %d containing %s", tc.path, code, body, tc.code, tc.want)
			}
		})
	}
	resp, err := c.Post("http://strapd/api/v1/status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d, want 405", resp.StatusCode)
	}
}

func TestFilterSnapshot(t *testing.T) {
	s := trace.Snapshot{
		Sessions:    []trace.Session{{ID: "3", PID: 10}, {ID: "5", PID: 11}},
		Watched:     []int{1, 10, 11},
		OffCPUNs:    map[string]uint64{"1": 1, "10": 2, "11": 3},
		PageFaults:  map[string]uint64{"10": 2, "11": 3},
		DeviceOpens: []trace.DeviceOpen{{PID: 10, Path: "/dev/nvidia0"}, {PID: 11, Path: "/dev/nvidiactl"}},
		Inflight:    []trace.DeviceCount{{DeviceName: "vda", Count: 2}},
		Pressure:    map[string]trace.PSIResource{"io": {}},
		Sched:       map[string]trace.Sched{"10": {}, "11": {}},
	}
	st := control.StatusReply{Daemon: control.DaemonStatus{PID: 1}, Sessions: []control.SessionStatus{{Session: 5, PID: 11, UID: 1000}}}
	got := filterSnapshot(s, &Peer{Cred: unix.Ucred{Uid: 1000}}, st)
	if len(got.Sessions) != 1 || got.Sessions[0].ID != "5" || len(got.Watched) != 2 || got.OffCPUNs["10"] != 0 ||
		got.OffCPUNs["11"] != 3 || got.OffCPUNs["1"] != 1 || len(got.DeviceOpens) != 1 || len(got.Inflight) != 1 ||
		len(got.Pressure) != 1 || len(got.Sched) != 1 {
		t.Fatalf("filtered for uid 1000: %+v", got)
	}
	if all := filterSnapshot(s, &Peer{}, st); len(all.Sessions) != 2 || len(all.PageFaults) != 2 {
		t.Fatalf("root: %+v", all)
	}
}

// TestFilterCoversEverySlice: a slice of the snapshot that names processes must be one
// filterSnapshot filters by hand (maps are filtered whatever their name); a collector that
// adds another has to be added there, or this fails.
func TestFilterCoversEverySlice(t *testing.T) {
	handled := map[string]bool{"Sessions": true, "Watched": true, "DeviceOpens": true, "Threads": true,
		"TokensKernel": true, "Spans": true, "ModelLoad": true}
	typ := reflect.TypeOf(trace.Snapshot{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Slice {
			continue
		}
		el := f.Type.Elem()
		names := el.Kind() == reflect.Int
		if el.Kind() == reflect.Struct {
			_, names = el.FieldByName("PID")
		}
		if names && !handled[f.Name] {
			t.Errorf("Snapshot.%s lists processes but filterSnapshot does not filter it", f.Name)
		}
	}
}

func TestTraceRing(t *testing.T) {
	ring := NewSnapshotRing(3)
	be := &fakeBackend{}
	a := startAPI(t, be, Options{Trace: ring})
	c := a.client(nil)
	code, body := get(t, c, "/api/v1/trace?n=5")
	if code != 200 || !strings.Contains(string(body), `"snapshots": []`) {
		t.Fatalf("empty ring: %d %s", code, body)
	}
	for i := range 5 {
		ring.Add(trace.Snapshot{Timestamp: float64(i)})
	}
	code, body = get(t, c, "/api/v1/trace?n=2")
	var tr TraceReply
	if err := json.Unmarshal(body, &tr); err != nil || code != 200 || len(tr.Snapshots) != 2 ||
		tr.Snapshots[0].Timestamp != 3 || tr.Snapshots[1].Timestamp != 4 {
		t.Fatalf("n=2: %d %s %v", code, body, err)
	}
	for _, q := range []string{"n=0", "n=61", "n=x"} {
		if code, body := get(t, c, "/api/v1/trace?"+q); code != 400 {
			t.Fatalf("%s: %d %s", q, code, body)
		}
	}
}

// logSession makes a session owned by root whose output is under dir.
func logSession(dir string, id uint64) control.SessionStatus {
	return control.SessionStatus{Session: id, UID: 0, PID: 10, OutputPath: filepath.Join(dir, fmt.Sprintf("run%d.strap", id))}
}

func appendLine(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func TestResourceLogsRead(t *testing.T) {
	dir := t.TempDir()
	be := &fakeBackend{}
	s1, s2 := logSession(dir, 1), logSession(dir, 2)
	be.set(s1, s2, control.SessionStatus{Session: 3, OutputPath: "relative.strap"})
	log1 := s1.OutputPath + ResourceSuffix
	// The resource monitor's format (RESOURCE_EVENTS.md): timestamp in Unix µs, layer_id.
	appendLine(t, log1, `{"timestamp": 100500000, "event": "load", "layer_id": 3, "rss": 1}`+"\n")
	// An older writer: the timestamp quoted, the layer named "layer".
	appendLine(t, log1, `{"timestamp": "101000000", "event": "alloc", "layer": "model.layers.3.mlp"}`+"\n")
	appendLine(t, log1, "not json\n\n") // line 4 is empty: counted, not an event
	appendLine(t, log1, `{"timestamp": 102000000, "event": "load", "layer_id": 4, "layer": 3}`+"\n")
	appendLine(t, log1, `{"timestamp": 100.5, "event": "load", "layer_id": null}`+"\n")
	appendLine(t, log1, `{"timestamp": 103000000, "event": "lo`) // being written
	a := startAPI(t, be, Options{})
	c := a.client(nil)
	tests := []struct {
		name, query string
		code        int
		lines       []int
		want        string
	}{
		{"everything", "", 200, []int{1, 2, 5}, `"error": "no resource log (yet)"`},
		{"seconds timestamp", "", 200, []int{1, 2, 5}, `"line": 6,
      "error": "timestamp: want Unix microseconds`},
		{"by event", "?event=load", 200, []int{1, 5}, `"incomplete_tail": true`},
		{"by numeric layer", "?layer=3", 200, []int{1}, ""}, // line 5's layer_id wins over its layer
		{"by layer_id", "?layer=4", 200, []int{5}, ""},
		{"by module layer", "?layer=model.layers.3.mlp", 200, []int{2}, ""},
		{"since unix", "?since=101", 200, []int{2, 5}, ""},
		{"since fractional", "?since=100.5", 200, []int{1, 2, 5}, ""},
		{"since rfc3339", "?since=1970-01-01T00:01:41Z", 200, []int{2, 5}, ""},
		{"since rfc3339 µs", "?since=1970-01-01T00:01:41.000001Z", 200, []int{5}, ""},
		{"one session", "?session=1&limit=1", 200, []int{1}, `"truncated": true`},
		{"relative output", "?session=3", 200, nil, "not an absolute path"},
		{"malformed since", "?since=yesterday", 400, nil, `since \"yesterday\"`},
		{"negative since", "?since=-5", 400, nil, "non-negative"},
		{"unknown session", "?session=77", 404, nil, "unknown_session"},
		{"bad follow", "?follow=yes", 400, nil, `follow \"yes\"`},
		{"bad limit", "?limit=0", 400, nil, "limit"},
		{"limit with follow", "?follow=1&limit=5", 400, nil, "not to follow"},
		{"unknown parameter", "?sesion=1", 400, nil, `unknown query parameter \"sesion\"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, c, "/api/v1/resource-logs"+tc.query)
			if code != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("%d %s; want %d with %s", code, body, tc.code, tc.want)
			}
			if code != 200 {
				return
			}
			var rep ResourceLogReply
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, e := range rep.Events {
				got = append(got, e.Line)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.lines) {
				t.Fatalf("lines %v, want %v\n%s", got, tc.lines, body)
			}
			if tc.query == "" && (len(rep.Malformed) != 2 || rep.Malformed[0].Line != 3 || rep.Malformed[1].Line != 6) {
				t.Fatalf("malformed %+v, want lines 3 and 6", rep.Malformed)
			}
		})
	}
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct{ name, id, data string }

func readEvents(r *bufio.Reader, out chan<- sseEvent) {
	var ev sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			close(out)
			return
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.name != "" {
				out <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		}
	}
}

func waitEvent(t *testing.T, ch <-chan sseEvent, name string) sseEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended waiting for %s", name)
			}
			if ev.name == name {
				return ev
			}
			t.Logf("skipping event %+v", ev)
		case <-timeout:
			t.Fatalf("no %s event in 10 s", name)
		}
	}
}

// TestFollowDeliversNewLines: a follower gets lines written after it connected (not the
// ones before), events of a session opened later, and session_end when sessions end.
func TestFollowDeliversNewLines(t *testing.T) {
	dir := t.TempDir()
	be := &fakeBackend{}
	s1 := logSession(dir, 1)
	be.set(s1)
	log1 := s1.OutputPath + ResourceSuffix
	appendLine(t, log1, `{"timestamp": 1000000, "event": "old"}`+"\n")
	a := startAPI(t, be, Options{Poll: 20 * time.Millisecond})
	resp, err := a.client(nil).Get("http://strapd/api/v1/resource-logs?follow=1&event=new")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("follow: %d %v", resp.StatusCode, resp.Header)
	}
	events := make(chan sseEvent, 16)
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, ": following") {
		t.Fatalf("first line %q %v", line, err)
	}
	go readEvents(br, events)
	// The stream is open (its first comment arrived): every line from here on is new.
	appendLine(t, log1, `{"timestamp": 2000000, "event": "skip"}`+"\n"+`{"timestamp": 3000000, "event": "new", "n": 1}`+"\n")
	ev := waitEvent(t, events, "resource")
	var e Event
	if err := json.Unmarshal([]byte(ev.data), &e); err != nil || e.Session != 1 || e.Line != 3 || ev.id != "1:3" ||
		!strings.Contains(string(e.Event), `"n":1`) {
		t.Fatalf("event %+v (%v)", ev, err)
	}
	s2 := logSession(dir, 2)
	be.set(s1, s2)
	time.Sleep(100 * time.Millisecond)
	appendLine(t, s2.OutputPath+ResourceSuffix, `{"event": "new", "n": 2}`+"\n")
	if ev := waitEvent(t, events, "resource"); !strings.Contains(ev.data, `"session":2`) {
		t.Fatalf("second session's event %+v", ev)
	}
	appendLine(t, log1, "{broken\n")
	if ev := waitEvent(t, events, "malformed"); !strings.Contains(ev.data, `"line":4`) || !strings.Contains(ev.data, `"session":1`) {
		t.Fatalf("malformed %+v", ev)
	}
	be.set(s2)
	if ev := waitEvent(t, events, "session_end"); ev.data != `{"session":1}` {
		t.Fatalf("session_end %+v", ev)
	}
}

// TestFollowerLimit: past MaxFollowers a follow request gets 429 with a JSON error; the
// streams already open and plain requests keep working.
func TestFollowerLimit(t *testing.T) {
	dir := t.TempDir()
	be := &fakeBackend{}
	be.set(logSession(dir, 1))
	a := startAPI(t, be, Options{MaxFollowers: 16, Poll: 50 * time.Millisecond})
	c := a.client(nil)
	const n = 500
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []io.Closer
	var other []string
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get("http://strapd/api/v1/resource-logs?follow=1")
			if err != nil {
				mu.Lock()
				other = append(other, err.Error())
				mu.Unlock()
				return
			}
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
				mu.Lock()
				open = append(open, resp.Body)
				mu.Unlock()
			case http.StatusTooManyRequests:
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(b), "too_many_followers") && resp.Header.Get("Retry-After") != "" {
					refused.Add(1)
				}
			default:
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 16 || refused.Load() != n-16 || len(other) > 0 {
		t.Fatalf("%d streams, %d refused with 429, errors %v", ok.Load(), refused.Load(), other)
	}
	if code, _ := get(t, c, "/api/v1/status"); code != 200 {
		t.Fatalf("status while full: %d", code)
	}
	for _, b := range open {
		b.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.h.followers.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := a.h.followers.Load(); n != 0 {
		t.Fatalf("%d followers counted after every stream closed", n)
	}
}

// TestOpenAPIPathsServed: every path docs/openapi.yaml describes is routed (not the
// not_found fallback), and the file describes as many paths as the handler serves.
func TestOpenAPIPathsServed(t *testing.T) {
	b, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "  /api/") && strings.HasSuffix(line, ":") {
			paths = append(paths, strings.TrimSuffix(strings.TrimSpace(line), ":"))
		}
	}
	if len(paths) != 5 {
		t.Fatalf("openapi.yaml has %d paths %v; the handler serves 5", len(paths), paths)
	}
	be := &fakeBackend{}
	be.set(control.SessionStatus{Session: 1, UID: 0})
	a := startAPI(t, be, Options{Trace: NewSnapshotRing(1)})
	c := a.client(nil)
	for _, p := range paths {
		code, body := get(t, c, strings.ReplaceAll(p, "{id}", "1"))
		if code == 404 && strings.Contains(string(body), "not_found") {
			t.Errorf("%s is documented but not served", p)
		}
	}
}
