package codec

import (
	"fmt"
	"slices"
	"sync"

	"github.com/pierrec/lz4/v4"

	"github.com/strap-llm/strap/internal/dtype"
)

func init() {
	Register("lz4", LZ4, newLZ4)
}

// lz4Codec writes LZ4 block format (no frame). Level 0 is the fast compressor; levels 1–9
// use the high-compression compressor with search depth 2^(8+level).
type lz4Codec struct {
	level int
	fast  sync.Pool // *lz4.Compressor: its hash table is 64 KiB, too big to allocate per block
	hc    sync.Pool // *lz4.CompressorHC
}

func newLZ4(o Options) (Codec, error) {
	if o.Lossy != nil {
		return nil, fmt.Errorf("lz4: %w", ErrLossyOption)
	}
	if o.Level < 0 || o.Level > 9 {
		return nil, fmt.Errorf("lz4: level %d not in 0..9: %w", o.Level, ErrBadLevel)
	}
	c := &lz4Codec{level: o.Level}
	c.fast.New = func() any { return new(lz4.Compressor) }
	hcLevel := lz4.CompressionLevel(1 << (8 + o.Level))
	c.hc.New = func() any { return &lz4.CompressorHC{Level: hcLevel} }
	return c, nil
}

func (*lz4Codec) ID() ID       { return LZ4 }
func (*lz4Codec) Name() string { return "lz4" }

func (c *lz4Codec) Encode(dst, src []byte, _ dtype.DType) ([]byte, bool, error) {
	if len(src) == 0 {
		return dst, false, nil
	}
	bound := lz4.CompressBlockBound(len(src))
	l := len(dst)
	out := slices.Grow(dst, bound)
	buf := out[l : l+bound]
	var n int
	var err error
	if c.level == 0 {
		cm := c.fast.Get().(*lz4.Compressor)
		n, err = cm.CompressBlock(src, buf)
		c.fast.Put(cm)
	} else {
		cm := c.hc.Get().(*lz4.CompressorHC)
		n, err = cm.CompressBlock(src, buf)
		c.hc.Put(cm)
	}
	if err != nil {
		return dst, false, fmt.Errorf("lz4 compress: %w", err)
	}
	if n == 0 || n >= len(src) {
		return dst, false, nil
	}
	return out[:l+n], true, nil
}

func (*lz4Codec) Decode(dst, src []byte, _ dtype.DType, rawLen int) ([]byte, error) {
	// Encode never compresses an empty block, and the lz4 decoder faults on an empty dst.
	if rawLen <= 0 || rawLen > lz4MaxDecoded(len(src)) {
		return dst, fmt.Errorf("lz4: %d stored bytes cannot decode to %d: %w", len(src), rawLen, ErrCorrupt)
	}
	l := len(dst)
	out := slices.Grow(dst, rawLen)[:l+rawLen]
	n, err := lz4.UncompressBlock(src, out[l:])
	if err != nil {
		return dst, fmt.Errorf("lz4: %w: %w", ErrCorrupt, err)
	}
	if n != rawLen {
		return dst, fmt.Errorf("lz4: decoded %d bytes, want %d: %w", n, rawLen, ErrCorrupt)
	}
	return out, nil
}

// MaxDecodedLen: an LZ4 sequence adds at most 255 output bytes per input byte of match
// length, so no valid block expands more than that.
func (*lz4Codec) MaxDecodedLen(stored int) int { return lz4MaxDecoded(stored) }

func lz4MaxDecoded(stored int) int { return 256*stored + 16 }
