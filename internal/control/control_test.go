package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/jsontext"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/protocol")

const goldenDir = "../../testdata/protocol"

// goldenMessages are encoded with Encode; the Python encoder must produce the same bytes
// (testdata/protocol/README.md). Bodies are structs so field order is fixed.
var goldenMessages = []struct {
	file string
	t    Type
	body any
}{
	{"hello.bin", TypeHello, Hello{Protocol: 1, Client: "llm_instrumentation/0.1.0", PID: 1234}},
	{"welcome.bin", TypeWelcome, Welcome{Protocol: 1, Daemon: "strapd 0.1.0", PID: 42, MaxMessage: 65536,
		MaxRingSize: 1 << 30}},
	{"open.bin", TypeOpen, Open{RingSize: 67108864, Codec: "zstd", CodecLevel: 3, Policy: "block", BlockSize: 1048576,
		Metadata: map[string]any{"model_class": "LlamaForCausalLM", "output_path": "/abs/capture.strap"}}},
	{"opened.bin", TypeOpened, Opened{Session: 7, BlockSize: 1048576}},
	{"publish.bin", TypePublish, Publish{Head: 4096, Seq: 3}},
	{"release.bin", TypeRelease, Release{Tail: 2048}},
	{"drop.bin", TypeDrop, Drop{Seq: 4, Name: "model.layers.3.mlp", Step: 10, Forward: 2, Bytes: 8192, Reason: "ring_full"}},
	{"close.bin", TypeClose, Close{Seq: 4, Head: 4096, Drops: 1}},
	{"closed.bin", TypeClosed, Closed{Packets: 3, Drops: 1, BytesIn: 12288, BytesOut: 12288, FileBytes: 13000}},
	{"error_protocol_version.bin", TypeError, Error{Code: "protocol_version", Message: "client speaks protocol 2, strapd speaks protocol 1", Fatal: true}},
	{"error_memory_budget.bin", TypeError, Error{Code: "memory_budget", Message: "memory budget exceeded: session needs 541323200 bytes (ring 268435456 + compression buffers 272887744), 4026531840 of 4294967296 in use; a ring of at most 132116480 bytes fits now (--memory-limit)",
		Fatal: true, FitsRingSize: ptr(uint64(132116480))}},
	{"status.bin", TypeStatus, nil},
	{"token.bin", TypeToken, Token{Seq: 5, Index: 2, TokenID: 1234, Text: " the", Position: ptr(int64(8))}},
	{"token_head.bin", TypeToken, Token{Seq: 9, Index: 3, TokenID: 42, Text: "!", Head: ptr(uint64(8192))}},
	{"opened_cursor.bin", TypeOpened, Opened{Session: 7, BlockSize: 1048576, PublishedCursor: true}},
	{"opened_ring_tokens.bin", TypeOpened, Opened{Session: 7, BlockSize: 1048576, PublishedCursor: true, RingTokens: true}},
	{"checkpoint.bin", TypeCheckpoint, Checkpoint{Seq: 5}},
	{"checkpointed.bin", TypeCheckpointed, Checkpointed{Seq: 5, Offset: 40960, Packets: 5, Drops: 0, Tokens: 2,
		LastOffset: 40800, LastCRC: 3735928559}},
	{"open_resume.bin", TypeOpen, Open{RingSize: 67108864, Codec: "lz4", Policy: "block", AppendAt: 40960,
		Resume: &Resume{LastSeq: 5, LastCRC: 3735928559, Packets: 5}}},
	{"open_resources.bin", TypeOpen, Open{RingSize: 67108864, Codec: "none", Policy: "block", Resources: true}},
	{"resources.bin", TypeResources, Resources{Events: []json.RawMessage{
		json.RawMessage(`{"event":"compute_execution","step":3,"flops":65536,"duration_us":12.5}`),
		json.RawMessage(`{"event":"kv_cache_update","step":3,"cache_bytes":8192}`)}}},
}

func ptr[T any](v T) *T { return &v }

func TestGoldenMessages(t *testing.T) {
	for _, g := range goldenMessages {
		t.Run(g.file, func(t *testing.T) {
			b, err := Encode(g.t, g.body)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(goldenDir, g.file)
			if *update {
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update): %v", err)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("encoding differs from %s:\n got %q\nwant %q", g.file, b, want)
			}
			m, err := Decode(want)
			if err != nil || m.Type != g.t || m.Version != Version {
				t.Fatalf("decode: %+v %v", m, err)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	good, _ := Encode(TypePublish, Publish{Head: 64, Seq: 1})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tests := []struct {
		name    string
		b       []byte
		wantSub string
	}{
		{"short", good[:5], "header needs 12"},
		{"magic", mut(func(b []byte) []byte { b[0] = 'X'; return b }), "magic"},
		{"body_len long", mut(func(b []byte) []byte { b[8]++; return b }), "body_len"},
		{"body_len short", mut(func(b []byte) []byte { return b[:len(b)-1] }), "body_len"},
		{"not json", mut(func(b []byte) []byte { b[12] = 'x'; return b }), "not valid JSON"},
		{"array", func() []byte { b, _ := EncodeRaw(1, TypeStatus, []byte("[1]")); return b }(), "not a JSON object"},
		{"empty body", func() []byte { b, _ := EncodeRaw(1, TypeStatus, nil); return b }(), "not valid JSON"},
		{"too long", make([]byte, MaxMessage+1), "at most 65536"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.b)
			if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want ErrBadMessage containing %q", err, tc.wantSub)
			}
		})
	}
}

func TestUnmarshalRequired(t *testing.T) {
	b, _ := EncodeRaw(1, TypeOpen, []byte(`{"ring_size":8192,"codec":"none","extra":1}`))
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var o Open
	err = m.Unmarshal(&o, OpenRequired...)
	if err == nil || !strings.Contains(err.Error(), `required field "policy"`) {
		t.Fatalf("err = %v", err)
	}
	b, _ = EncodeRaw(1, TypeOpen, []byte(`{"ring_size":8192,"codec":"none","policy":"drop","future":{"x":1}}`))
	m, _ = Decode(b)
	if err := m.Unmarshal(&o, OpenRequired...); err != nil || o.Policy != "drop" || o.RingSize != 8192 {
		t.Fatalf("unknown fields must be ignored: %+v %v", o, err)
	}
}

func socketPair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return NewConn(c.(*net.UnixConn))
	}
	a, b := mk(fds[0]), mk(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func openFDs(t *testing.T) int {
	t.Helper()
	var n int
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n = len(ents)
	return n
}

func TestFDPassing(t *testing.T) {
	a, b := socketPair(t)
	f1, _ := os.CreateTemp(t.TempDir(), "a")
	f2, _ := os.CreateTemp(t.TempDir(), "b")
	f3, _ := os.CreateTemp(t.TempDir(), "c")
	defer f1.Close()
	defer f2.Close()
	defer f3.Close()

	t.Run("two fds", func(t *testing.T) {
		if err := a.Send(TypeOpen, Open{RingSize: 8192, Codec: "none", Policy: "block"}, int(f1.Fd()), int(f2.Fd())); err != nil {
			t.Fatal(err)
		}
		m, fds, err := b.Recv(2)
		if err != nil || m.Type != TypeOpen || len(fds) != 2 {
			t.Fatalf("recv: %v %v %v", m.Type, fds, err)
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
		}
	})
	t.Run("extra fds closed", func(t *testing.T) {
		before := openFDs(t)
		if err := a.Send(TypeOpen, Open{}, int(f1.Fd()), int(f2.Fd()), int(f3.Fd())); err != nil {
			t.Fatal(err)
		}
		_, fds, err := b.Recv(2)
		if !errors.Is(err, ErrTooManyFDs) || fds != nil {
			t.Fatalf("err = %v fds %v", err, fds)
		}
		if after := openFDs(t); after != before {
			t.Fatalf("fd leak: %d open before, %d after", before, after)
		}
	})
	t.Run("fds on a message that wants none", func(t *testing.T) {
		before := openFDs(t)
		if err := a.Send(TypePublish, Publish{}, int(f1.Fd())); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Recv(0); !errors.Is(err, ErrTooManyFDs) {
			t.Fatalf("err = %v", err)
		}
		if after := openFDs(t); after != before {
			t.Fatalf("fd leak: %d open before, %d after", before, after)
		}
	})
	t.Run("version kept on mismatch", func(t *testing.T) {
		raw, _ := EncodeRaw(2, TypeHello, []byte("{}"))
		if err := a.SendRaw(raw); err != nil {
			t.Fatal(err)
		}
		m, _, err := b.Recv(0)
		if err != nil || m.Version != 2 || m.Type != TypeHello {
			t.Fatalf("got %+v %v", m, err)
		}
	})
	t.Run("peer cred", func(t *testing.T) {
		c, err := b.PeerCred()
		if err != nil || int(c.Pid) != os.Getpid() {
			t.Fatalf("cred %+v %v", c, err)
		}
	})
}

func TestSocketPaths(t *testing.T) {
	t.Setenv("STRAPD_SOCKET", "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if got := DaemonSocketPath("/x.sock"); got != "/x.sock" {
		t.Fatal(got)
	}
	if os.Geteuid() != 0 {
		if got := DaemonSocketPath(""); got != "/run/user/1000/strapd/strapd.sock" {
			t.Fatal(got)
		}
	} else if got := DaemonSocketPath(""); got != "/run/strapd/strapd.sock" {
		t.Fatal(got)
	}
	t.Setenv("STRAPD_SOCKET", "/env.sock")
	if got := ClientSocketPath(""); got != "/env.sock" {
		t.Fatal(got)
	}
	t.Setenv("STRAPD_SOCKET", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	if _, err := os.Stat("/run/strapd/strapd.sock"); err != nil {
		want := filepath.Join("/tmp", "strapd-"+strconv.Itoa(os.Getuid()), "strapd.sock")
		if got := ClientSocketPath(""); got != want {
			t.Fatalf("got %s want %s", got, want)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*.bin"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("STRP"))
	// Bodies whose text encoding/json would rewrite to U+FFFD.
	for _, body := range []string{"{\"seq\":1,\"index\":0,\"text\":\"model.\xff\xfe\"}", `{"seq":1,"text":"\udcff"}`} {
		b, err := EncodeRaw(Version, TypeToken, []byte(body))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error does not wrap ErrBadMessage: %v", err)
			}
			return
		}
		if err := jsontext.Check(m.Body); err != nil {
			t.Fatalf("accepted a body jsontext rejects: %v", err)
		}
		// Every typed body must either decode or fail with ErrBadMessage, never panic.
		var bodies = []any{&Hello{}, &Open{}, &Publish{}, &Drop{}, &Close{}, &Token{}, &StatusReply{}, &Error{}}
		for _, v := range bodies {
			if err := m.Unmarshal(v, "seq"); err != nil && !errors.Is(err, ErrBadMessage) {
				t.Fatalf("unmarshal error does not wrap ErrBadMessage: %v", err)
			}
		}
		re, err := EncodeRaw(m.Version, m.Type, m.Body)
		if err != nil || !bytes.Equal(re, b) {
			t.Fatalf("re-encode differs")
		}
	})
}
