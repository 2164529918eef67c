package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
)

// openWith opens a session sending OPEN with the given descriptors after the ring (ring
// size, codec none and policy block are set here; the rest of req goes as given).
func openWith(t *testing.T, c *control.Client, req control.Open, fds ...*os.File) (*controltest.Stream, control.Opened, error) {
	t.Helper()
	const ringSize = shm.HeaderSize + 64<<10
	p, err := shm.NewProducer(ringSize, shm.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	req.RingSize, req.Codec, req.Policy = ringSize, "none", "block"
	ints := []int{int(p.File().Fd())}
	for _, f := range fds {
		ints = append(ints, int(f.Fd()))
	}
	if err := c.Conn().Send(control.TypeOpen, req, ints...); err != nil {
		t.Fatal(err)
	}
	m, _, err := c.Conn().Recv(0)
	if err != nil {
		return nil, control.Opened{}, err
	}
	switch m.Type {
	case control.TypeOpened:
		var o control.Opened
		if err := m.Unmarshal(&o, "session"); err != nil {
			t.Fatal(err)
		}
		return &controltest.Stream{C: c, P: p, Policy: "block"}, o, nil
	case control.TypeError:
		var e control.Error
		if err := m.Unmarshal(&e, "code"); err != nil {
			t.Fatal(err)
		}
		return nil, control.Opened{}, &e
	}
	t.Fatalf("unexpected %s", m.Type)
	return nil, control.Opened{}, nil
}

func resourceFile(t *testing.T, flag int) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "out.resources.jsonl"), flag|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func sessionStatus(t *testing.T, ts *testServer) control.SessionStatus {
	t.Helper()
	rep, err := ts.dial(t).Status()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Sessions) != 1 {
		t.Fatalf("%d sessions in status, want 1", len(rep.Sessions))
	}
	return rep.Sessions[0]
}

// TestResourceLog: events sent with RESOURCES land in the client's resource log as JSON
// lines, in order, compacted; status counts them; the file is complete after CLOSE.
func TestResourceLog(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.dial(t)
	out, res := outFile(t), resourceFile(t, os.O_WRONLY|os.O_TRUNC)
	st, _, err := openWith(t, c, control.Open{Resources: true}, out, res)
	if err != nil {
		t.Fatal(err)
	}
	res.Close() // the daemon holds its own copy, as a real client does
	bodies := []string{
		`{"events":[{"event":"resource_session_start","level":"MINIMAL"},{"event":"compute_execution", "flops": 65536}]}`,
		`{"events":[{"event":"kv_cache_update","cache_bytes":8192}]}`,
	}
	for _, b := range bodies {
		if err := c.Conn().Send(control.TypeResources, rawBody(b)); err != nil {
			t.Fatal(err)
		}
	}
	a := tensor("a", 1, 100)
	if err := st.Put(&a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return sessionStatus(t, ts).ResourceEvents == 3 })
	s := sessionStatus(t, ts)
	if !s.ResourceLog || s.ResourceEventsLost != 0 || s.ResourceLogError != "" {
		t.Fatalf("status %+v", s)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(res.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"event":"resource_session_start","level":"MINIMAL"}` + "\n" + `{"event":"compute_execution","flops":65536}` +
		"\n" + `{"event":"kv_cache_update","cache_bytes":8192}` + "\n"
	if string(got) != want {
		t.Fatalf("resource log:\n%s\nwant:\n%s", got, want)
	}
}

// rawBody sends a body verbatim (Send marshals it: a json.RawMessage stays as it is).
type rawBody string

func (r rawBody) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// TestResourceLogRefusals: descriptors that do not match "resources", a resource log that
// is not writable, RESOURCES without a log, and a malformed RESOURCES.
func TestResourceLogRefusals(t *testing.T) {
	ts := startServer(t, Config{})
	t.Run("resources without its descriptor", func(t *testing.T) {
		_, _, err := openWith(t, ts.dial(t), control.Open{Resources: true}, outFile(t))
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeBadMessage || !strings.Contains(e.Message, "resources") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("four descriptors without resources", func(t *testing.T) {
		_, _, err := openWith(t, ts.dial(t), control.Open{}, outFile(t), outFile(t), outFile(t))
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeBadMessage {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("read-only resource log", func(t *testing.T) {
		ro := resourceFile(t, os.O_RDONLY)
		_, _, err := openWith(t, ts.dial(t), control.Open{Resources: true}, outFile(t), ro)
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeBadOutput || !strings.Contains(e.Message, "resource log") {
			t.Fatalf("got %v", err)
		}
	})
	for _, tc := range []struct {
		name      string
		resources bool
		body      string
		want      string
	}{
		{"RESOURCES without a log", false, `{"events":[{"event":"x"}]}`, "no resource log"},
		{"event without a name", true, `{"events":[{"flops":1}]}`, "event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial(t)
			fds := []*os.File{outFile(t)}
			if tc.resources {
				fds = append(fds, resourceFile(t, os.O_WRONLY|os.O_TRUNC))
			}
			if _, _, err := openWith(t, c, control.Open{Resources: tc.resources}, fds...); err != nil {
				t.Fatal(err)
			}
			if err := c.Conn().Send(control.TypeResources, rawBody(tc.body)); err != nil {
				t.Fatal(err)
			}
			m, _, err := c.Conn().Recv(0)
			if err != nil {
				t.Fatal(err)
			}
			var e control.Error
			if m.Type != control.TypeError || m.Unmarshal(&e, "code") != nil || e.Code != control.CodeBadMessage ||
				!strings.Contains(e.Message, tc.want) {
				t.Fatalf("got %s %s", m.Type, m.Body)
			}
		})
	}
}
