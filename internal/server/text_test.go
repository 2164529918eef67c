package server

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// endedWithError waits for the session's stream to end with status error and checks it is
// otherwise whole (verify finds END, INDEX and footer) and never holds bad.
func endedWithError(t *testing.T, path string, bad []byte) {
	t.Helper()
	waitFor(t, func() bool {
		s, err := pipelineStream(path)
		return err == nil && s == "error"
	})
	rep, err := stream.VerifyFile(path)
	if err != nil || !rep.OK || rep.End == nil || rep.End.Status != "error" {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, bad) {
		t.Fatalf("the stream holds %q", bad)
	}
}

// TestRecordNameNotUTF8: a ring record named "model.\xff\xfe" (a real Go producer, no Python)
// ends that session with a fatal bad_record naming the bytes; a session alongside is
// untouched, and the tensors before the bad one are in the stream.
func TestRecordNameNotUTF8(t *testing.T) {
	ts := startServer(t, Config{})
	alongside(t, ts, func(t *testing.T) {
		c := ts.dial(t)
		out := outFile(t)
		st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "lz4", Policy: "block"})
		if err != nil {
			t.Fatal(err)
		}
		good := tensor("model.layers.0.mlp", 1, 100)
		if err := st.Put(&good); err != nil {
			t.Fatal(err)
		}
		bad := tensor("model.\xff\xfe", 2, 100)
		if err := st.Put(&bad); err != nil {
			t.Fatal(err)
		}
		wantError(t, c, control.CodeBadRecord, `name "model.\xff\xfe" is not valid UTF-8`)
		endedWithError(t, out.Name(), []byte("model.\xff\xfe"))
		checkStream(t, out.Name(), []shm.Tensor{good}, "error")
	})
}

// TestControlTextNotUTF8: a TOKEN whose text is not valid UTF-8, or is a lone surrogate
// escape, is a fatal bad_message; encoding/json would have written U+FFFD in its place.
// DROP names go through the same check.
func TestControlTextNotUTF8(t *testing.T) {
	ts := startServer(t, Config{})
	tests := []struct {
		name string
		typ  control.Type
		body string // %d is the sequence number
		sub  string
		bad  string // must not reach the stream
	}{
		{"token raw bytes", control.TypeToken, "{\"seq\":%d,\"index\":0,\"token_id\":7,\"text\":\"model.\xff\xfe\"}",
			"TOKEN body: not valid UTF-8", "\ufffd"},
		{"token lone surrogate", control.TypeToken, `{"seq":%d,"index":0,"token_id":7,"text":"a\udcff"}`,
			`TOKEN body: unpaired surrogate escape \udcff`, "\ufffd"},
		{"drop name", control.TypeDrop, "{\"seq\":%d,\"name\":\"model.\xff\xfe\",\"step\":0,\"forward\":0,\"bytes\":4,\"reason\":\"ring_full\"}",
			"DROP body: not valid UTF-8", "\ufffd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial(t)
			out := outFile(t)
			st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<10, out, control.Open{Codec: "none", Policy: "block"})
			if err != nil {
				t.Fatal(err)
			}
			good := tensor("model.layers.0.mlp", 1, 100)
			if err := st.Put(&good); err != nil {
				t.Fatal(err)
			}
			raw, err := control.EncodeRaw(control.Version, tc.typ, fmt.Appendf(nil, tc.body, st.P.TakeSeq()))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Conn().SendRaw(raw); err != nil {
				t.Fatal(err)
			}
			wantError(t, c, control.CodeBadMessage, tc.sub)
			endedWithError(t, out.Name(), []byte(tc.bad))
			checkStream(t, out.Name(), []shm.Tensor{good}, "error")
		})
	}
}
