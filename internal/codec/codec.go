// Package codec owns the block codecs of the stream format (docs/STREAM_FORMAT.md section 5):
// each turns one block of raw tensor bytes into its stored form and back.
package codec

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/strap-llm/strap/internal/dtype"
)

// ID is a codec number as stored in a packet header.
type ID uint8

// Codec numbers; part of the stream format. 16–63 are reserved for activation codecs.
const (
	None ID = 0
	LZ4  ID = 1
	Zstd ID = 2
)

// Errors returned by this package.
var (
	// ErrUnknownCodec: no codec is registered under that name or number.
	ErrUnknownCodec = errors.New("unknown codec")
	// ErrCorrupt: a stored block does not decode to the expected size.
	ErrCorrupt = errors.New("corrupt block")
	// ErrLossyOption: a lossless codec was given a lossy error bound.
	ErrLossyOption = errors.New("lossless codec takes no lossy bound")
	// ErrBlockTable: a payload's block table disagrees with its packet header or itself.
	ErrBlockTable = errors.New("bad block table")
)

// MaxBlockSize is the largest block_size a stream may use (docs/STREAM_FORMAT.md 5); it
// bounds what one block can make a reader allocate.
const MaxBlockSize = 64 << 20

// Bounder is implemented by codecs that know the most raw bytes a stored block of a given
// size can decode to. Readers use it to reject lying sizes before allocating.
type Bounder interface {
	MaxDecodedLen(stored int) int
}

// Codec encodes and decodes independent blocks. Implementations are safe for concurrent use
// by many goroutines (the pipeline's worker pool shares one instance).
type Codec interface {
	// ID is the number written into packet headers.
	ID() ID
	// Name is the configuration name ("none", "lz4", "zstd", ...).
	Name() string
	// Encode appends the stored form of src (raw little-endian elements of type dt) to dst.
	// compressed=false means the codec could not shrink src: the caller stores src verbatim
	// and marks the block raw (bit 31 of its size in the block table); out is then dst.
	Encode(dst, src []byte, dt dtype.DType) (out []byte, compressed bool, err error)
	// Decode appends the rawLen decoded bytes of the stored block src to dst.
	Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error)
}

// Options configure a codec instance. The zero value is every codec's default.
type Options struct {
	// Level is the codec-specific effort level; 0 picks the codec's default.
	Level int
	// Lossy configures error-bounded codecs (issue 5); nil for lossless codecs, which
	// reject a non-nil value.
	Lossy *LossyBound
}

// LossyBound is the error a lossy codec may introduce, as the user stated it.
type LossyBound struct {
	// Mode is "abs" (max absolute error) or "rel" (relative to the tensor's RMS) or "fp16"
	// or "fp8".
	Mode string
	// Value is the bound: for "fp16" an optional relative L2 cap on top of its rounding,
	// for "fp8" an optional cap on every row's relative L2 error (0: none).
	Value float64
}

// Factory builds a codec from its options.
type Factory func(Options) (Codec, error)

var (
	mu     sync.RWMutex
	byName = map[string]Factory{}
	byID   = map[ID]string{}
)

// Register makes a codec available by name and number. It panics on a duplicate, which is
// a programming error caught by any test run.
func Register(name string, id ID, f Factory) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := byName[name]; dup {
		panic("codec: duplicate name " + name)
	}
	if _, dup := byID[id]; dup {
		panic(fmt.Sprintf("codec: duplicate id %d", id))
	}
	byName[name] = f
	byID[id] = name
}

// New builds the codec configured by name.
func New(name string, opts Options) (Codec, error) {
	mu.RLock()
	f, ok := byName[name]
	mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownCodec, name, Names())
	}
	return f(opts)
}

// ByID builds the codec stored under id, at its default level (decoding needs no level).
func ByID(id ID) (Codec, error) {
	mu.RLock()
	name, ok := byID[id]
	mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownCodec, id)
	}
	return New(name, Options{})
}

// Names lists the registered codec names, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, 0, len(byName))
	for n := range byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
