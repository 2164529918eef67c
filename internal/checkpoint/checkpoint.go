package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"
)

// Format identifiers of a checkpoint file.
const (
	// FormatName is the "format" field of every checkpoint.
	FormatName = "strap-checkpoint"
	// Version is the checkpoint format version this package reads.
	Version = 1
	// Suffix is appended to a stream's path to name its default checkpoint.
	Suffix = ".ckpt.json"
	// MaxSize bounds a checkpoint file. A capture started through 1.3.1's API form also
	// writes 1.3.1's token list into it (about 80 bytes a token; docs/CHECKPOINTS.md 3), which
	// this does not read but must admit; past this size the client leaves that list out.
	MaxSize = 64 << 20
)

// Errors returned by this package.
var (
	// ErrFormat: a checkpoint file is not a valid version-1 checkpoint.
	ErrFormat = errors.New("not a valid checkpoint")
	// ErrMismatch: a stream does not match its checkpoint.
	ErrMismatch = errors.New("stream does not match its checkpoint")
	// ErrInUse: a live capture holds the stream's lock.
	ErrInUse = errors.New("stream is in use by a live capture")
)

// Checkpoint is one checkpoint file: the durable facts strapd reported (CHECKPOINTED)
// plus the client's own state at that point.
type Checkpoint struct {
	// Format is FormatName; Version is 1.
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Stream is the stream file's absolute path (a label: resume names the file itself).
	Stream string `json:"stream"`
	// Created is when the checkpoint was written (RFC 3339).
	Created string `json:"created"`
	// Fingerprint identifies the capture config and model; the stream header's
	// client_metadata carries the same value.
	Fingerprint string `json:"fingerprint"`
	// StreamOffset is the stream's length at the checkpoint: a resume appends here.
	StreamOffset int64 `json:"stream_offset"`
	// Packets counts TENSOR, DROP and TOKEN packets before StreamOffset; Drops the DROP ones.
	Packets uint64 `json:"packets"`
	Drops   uint64 `json:"drops"`
	// LastSeq is the last packet's sequence number (0: none).
	LastSeq uint64 `json:"last_seq"`
	// LastPacketOffset and LastPacketCRC locate and identify the last packet.
	LastPacketOffset int64  `json:"last_packet_offset"`
	LastPacketCRC    uint32 `json:"last_packet_crc"`
	// TokenCount is the number of tokens recorded (and written as TOKEN packets); the
	// resumed capture's next forward pass has step TokenCount.
	TokenCount uint64 `json:"token_count"`
	// ForwardCount is the number of forward passes captured so far.
	ForwardCount uint64 `json:"forward_count"`
	// TokenLog, when set, is how much of the token log beside the checkpoint (TokenLogPath)
	// it vouches for; a capture that uploads keeps one. A resume over a freed prefix takes
	// the freed tokens from it (or from 1.3.1's list).
	TokenLog *TokenLog `json:"token_log,omitempty"`
	// ListedTokens is the length of 1.3.1's `tokens` list the Python client writes beside
	// these keys for a capture started through 1.3.1's API form (-1: none).
	ListedTokens int `json:"-"`
	// Path is the file the checkpoint was loaded from ("" when parsed from bytes): the
	// token log lies beside it.
	Path string `json:"-"`
}

// TokenLog is a checkpoint's "token_log" key: the log's first Bytes bytes hold Tokens lines,
// one JSON token each, numbered 0..Tokens-1, and their CRC32C (Castagnoli) is CRC32C.
type TokenLog struct {
	Tokens uint64 `json:"tokens"`
	Bytes  int64  `json:"bytes"`
	CRC32C uint32 `json:"crc32c"`
}

// TokenLogSuffix is appended to a checkpoint's path to name its token log.
const TokenLogSuffix = ".tokens.jsonl"

// TokenLogPath is the token log of the checkpoint at ckpt.
func TokenLogPath(ckpt string) string { return ckpt + TokenLogSuffix }

// Parse decodes and checks a checkpoint. Unknown fields are allowed (later versions may add
// some); a missing required field, a wrong format or version, or inconsistent numbers are
// errors wrapping ErrFormat.
func Parse(b []byte) (*Checkpoint, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%d bytes, at most %d: %w", len(b), MaxSize, ErrFormat)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v: %w", err, ErrFormat)
	}
	if !utf8.Valid(b) {
		// encoding/json would replace it with U+FFFD; libstrap and the Python client refuse it
		return nil, fmt.Errorf("not valid UTF-8: %w", ErrFormat)
	}
	if off := unpairedSurrogate(b); off >= 0 {
		// encoding/json would replace it with U+FFFD; libstrap and the Python client refuse it
		return nil, fmt.Errorf("an unpaired surrogate escape at byte %d: %w", off, ErrFormat)
	}
	for _, k := range []string{"format", "version", "fingerprint", "stream_offset", "packets", "last_seq",
		"last_packet_offset", "last_packet_crc", "token_count"} {
		if v, ok := keys[k]; !ok || bytes.Equal(v, []byte("null")) {
			return nil, fmt.Errorf("missing field %q: %w", k, ErrFormat)
		}
	}
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("fields: %v: %w", err, ErrFormat)
	}
	if raw, ok := keys["token_log"]; ok && !bytes.Equal(raw, []byte("null")) {
		var tl map[string]json.RawMessage
		if err := json.Unmarshal(raw, &tl); err != nil {
			return nil, fmt.Errorf("token_log is not an object: %w", ErrFormat)
		}
		for _, k := range []string{"tokens", "bytes", "crc32c"} {
			if v, ok := tl[k]; !ok || bytes.Equal(v, []byte("null")) {
				return nil, fmt.Errorf("token_log: missing field %q: %w", k, ErrFormat)
			}
		}
	}
	c.ListedTokens = -1
	if raw, ok := keys["tokens"]; ok {
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			c.ListedTokens = len(list)
		}
	}
	switch {
	case c.Format != FormatName:
		return nil, fmt.Errorf("format %q, expected %q: %w", c.Format, FormatName, ErrFormat)
	case c.Version != Version:
		return nil, fmt.Errorf("version %d, this strapd reads %d: %w", c.Version, Version, ErrFormat)
	case c.StreamOffset <= 0:
		return nil, fmt.Errorf("stream_offset %d: %w", c.StreamOffset, ErrFormat)
	case (c.Packets == 0) != (c.LastSeq == 0):
		return nil, fmt.Errorf("%d packets with last_seq %d: %w", c.Packets, c.LastSeq, ErrFormat)
	case c.LastSeq < c.Packets:
		return nil, fmt.Errorf("last_seq %d below the packet count %d: %w", c.LastSeq, c.Packets, ErrFormat)
	case c.Packets > 0 && (c.LastPacketOffset <= 0 || c.LastPacketOffset >= c.StreamOffset):
		return nil, fmt.Errorf("last_packet_offset %d outside the stream prefix of %d bytes: %w",
			c.LastPacketOffset, c.StreamOffset, ErrFormat)
	case c.Drops > c.Packets || c.TokenCount > c.Packets:
		return nil, fmt.Errorf("drops %d / token_count %d exceed %d packets: %w", c.Drops, c.TokenCount, c.Packets, ErrFormat)
	case c.TokenLog != nil && (c.TokenLog.Tokens != c.TokenCount || c.TokenLog.Bytes < 0 ||
		uint64(c.TokenLog.Bytes) < c.TokenLog.Tokens || (c.TokenLog.Tokens == 0) != (c.TokenLog.Bytes == 0)):
		return nil, fmt.Errorf("token_log of %d tokens in %d bytes does not fit token_count %d: %w",
			c.TokenLog.Tokens, c.TokenLog.Bytes, c.TokenCount, ErrFormat)
	}
	return &c, nil
}

// Load reads and parses the checkpoint file at path.
func Load(path string) (*Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	defer f.Close()
	c, err := Read(f, path)
	if err == nil {
		c.Path = path
	}
	return c, err
}

// Read reads and parses a checkpoint from r (at most MaxSize bytes; name labels errors).
func Read(r io.Reader, name string) (*Checkpoint, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", name, err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	return c, nil
}

// DefaultPath is the checkpoint path of a stream when none is named.
func DefaultPath(stream string) string { return stream + Suffix }

// StreamFor is the stream a default-named checkpoint belongs to ("" when the name does not
// end with Suffix).
func StreamFor(ckpt string) string {
	if s, ok := strings.CutSuffix(ckpt, Suffix); ok && s != "" {
		return s
	}
	return ""
}

// unpairedSurrogate is the offset of the first \uXXXX escape of a UTF-16 surrogate that is
// not a high one followed by a low one, or -1. b is valid JSON (escapes occur only in strings).
func unpairedSurrogate(b []byte) int {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range b[i+2 : i+6] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		switch {
		case !ok:
			i++ // a one-letter escape: skip its letter (an escaped backslash included)
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex4(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		default:
			i += 5
		}
	}
	return -1
}
