package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goldenDir holds checkpoint files written by each client (and by 1.3.1), with the facts
// every reader must parse from them (expect.json): Go here, libstrap in
// clients/c/tests/test_checkpoint_golden.c, Python in tests/test_checkpoint_golden.py.
const goldenDir = "../../testdata/checkpoint"

// goldenFacts is one file's entry in expect.json.
type goldenFacts struct {
	Valid            bool      `json:"valid"`
	Stream           string    `json:"stream"`
	Fingerprint      string    `json:"fingerprint"`
	StreamOffset     int64     `json:"stream_offset"`
	Packets          uint64    `json:"packets"`
	Drops            uint64    `json:"drops"`
	LastSeq          uint64    `json:"last_seq"`
	LastPacketOffset int64     `json:"last_packet_offset"`
	LastPacketCRC    uint32    `json:"last_packet_crc"`
	TokenCount       uint64    `json:"token_count"`
	ForwardCount     uint64    `json:"forward_count"`
	ListedTokens     int       `json:"listed_tokens"`
	TokenLog         *TokenLog `json:"token_log"`
}

func TestGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Files map[string]goldenFacts `json:"files"`
	}
	if err := json.Unmarshal(raw, &exp); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(goldenDir, "*.ckpt.json"))
	if len(names) != len(exp.Files) {
		t.Fatalf("%d checkpoint files, expect.json names %d: every file needs its facts", len(names), len(exp.Files))
	}
	for name, want := range exp.Files {
		t.Run(name, func(t *testing.T) {
			c, err := Load(filepath.Join(goldenDir, name))
			if !want.Valid {
				if err == nil || !errors.Is(err, ErrFormat) {
					t.Fatalf("accepted (or not ErrFormat): %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := goldenFacts{Valid: true, Stream: c.Stream, Fingerprint: c.Fingerprint, StreamOffset: c.StreamOffset,
				Packets: c.Packets, Drops: c.Drops, LastSeq: c.LastSeq, LastPacketOffset: c.LastPacketOffset,
				LastPacketCRC: c.LastPacketCRC, TokenCount: c.TokenCount, ForwardCount: c.ForwardCount,
				ListedTokens: c.ListedTokens, TokenLog: c.TokenLog}
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			if string(g) != string(w) {
				t.Fatalf("parsed\n %s\nexpected\n %s", g, w)
			}
			if c.TokenLog != nil {
				if err := checkTokenLog(c); err != nil {
					t.Fatalf("its token log: %v", err)
				}
			}
		})
	}
}

// TestTokenLogDamage: a token log that does not hold what its checkpoint vouches for is named.
func TestTokenLogDamage(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "x.ckpt.json")
	b, err := os.ReadFile(filepath.Join(goldenDir, "python-token-log.ckpt.json"))
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(TokenLogPath(filepath.Join(goldenDir, "python-token-log.ckpt.json")))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ck, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(ck)
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), log...)
	flipped[3] ^= 1
	longer := append(append([]byte(nil), log...), []byte(`{"token_index": 3}`+"\n")...)
	for _, tc := range []struct {
		name string
		log  []byte
		want string
	}{
		{"intact", log, ""},
		{"longer (tokens past the checkpoint)", longer, ""},
		{"short", log[:len(log)-1], "vouches for"},
		{"flipped bit", flipped, "CRC32C"},
		{"missing", nil, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(TokenLogPath(ck))
			if tc.log != nil {
				if err := os.WriteFile(TokenLogPath(ck), tc.log, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := checkTokenLog(c)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
