package codec

import (
	"fmt"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/strap-llm/strap/internal/dtype"
)

func init() {
	Register("zstd", Zstd, newZstd)
}

// zstdMaxWindow bounds the window a frame may ask for; the writer's frames are one block
// each, so anything bigger than MaxBlockSize is hostile.
const zstdMaxWindow = MaxBlockSize

var (
	zstdEncMu sync.Mutex
	zstdEncs  = map[zstd.EncoderLevel]*zstd.Encoder{}

	zstdDecOnce sync.Once
	zstdDec     *zstd.Decoder
	zstdDecErr  error
)

// zstdCodec writes one zstd frame per block, with the frame content size set. Encoders
// and the decoder are shared process-wide: EncodeAll and DecodeAll are goroutine-safe.
type zstdCodec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// zstdLevel maps Options.Level to an encoder level: 0 and 1 fastest, 2 default,
// 3 better, 4 best.
func zstdLevel(l int) (zstd.EncoderLevel, error) {
	switch l {
	case 0, 1:
		return zstd.SpeedFastest, nil
	case 2:
		return zstd.SpeedDefault, nil
	case 3:
		return zstd.SpeedBetterCompression, nil
	case 4:
		return zstd.SpeedBestCompression, nil
	}
	return 0, fmt.Errorf("zstd: level %d not in 0..4: %w", l, ErrBadLevel)
}

func newZstd(o Options) (Codec, error) {
	if o.Lossy != nil {
		return nil, fmt.Errorf("zstd: %w", ErrLossyOption)
	}
	lvl, err := zstdLevel(o.Level)
	if err != nil {
		return nil, err
	}
	zstdEncMu.Lock()
	enc, ok := zstdEncs[lvl]
	if !ok {
		// No frame checksum: every packet already carries a CRC32C over its payload.
		// Single segment: the frame content size is then always written (without it a
		// frame under 1 KiB would omit it) and the window is the block itself.
		enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithEncoderCRC(false),
			zstd.WithSingleSegment(true))
		if err == nil {
			zstdEncs[lvl] = enc
		}
	}
	zstdEncMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	zstdDecOnce.Do(func() {
		zstdDec, zstdDecErr = zstd.NewReader(nil,
			zstd.WithDecoderMaxMemory(MaxBlockSize),
			zstd.WithDecoderMaxWindow(zstdMaxWindow),
			zstd.WithDecodeAllCapLimit(true),
		)
	})
	if zstdDecErr != nil {
		return nil, fmt.Errorf("zstd decoder: %w", zstdDecErr)
	}
	return &zstdCodec{enc: enc, dec: zstdDec}, nil
}

func (*zstdCodec) ID() ID       { return Zstd }
func (*zstdCodec) Name() string { return "zstd" }

func (c *zstdCodec) Encode(dst, src []byte, _ dtype.DType) ([]byte, bool, error) {
	if len(src) == 0 {
		return dst, false, nil
	}
	l := len(dst)
	out := c.enc.EncodeAll(src, dst)
	if len(out)-l >= len(src) {
		return out[:l], false, nil
	}
	return out, true, nil
}

func (c *zstdCodec) Decode(dst, src []byte, _ dtype.DType, rawLen int) ([]byte, error) {
	if rawLen < 0 || rawLen > MaxBlockSize {
		return dst, fmt.Errorf("zstd: block of %d bytes: %w", rawLen, ErrCorrupt)
	}
	// Check the frame's own size claim before allocating anything for it.
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return dst, fmt.Errorf("zstd header: %w: %w", ErrCorrupt, err)
	}
	if !h.HasFCS || h.FrameContentSize != uint64(rawLen) {
		return dst, fmt.Errorf("zstd: frame content size %d (set %v), want %d: %w",
			h.FrameContentSize, h.HasFCS, rawLen, ErrCorrupt)
	}
	l := len(dst)
	// Capacity exactly rawLen more: with WithDecodeAllCapLimit the decoder refuses to go past it.
	buf := slices.Grow(dst, rawLen)[: l : l+rawLen]
	out, err := c.dec.DecodeAll(src, buf)
	if err != nil {
		return dst, fmt.Errorf("zstd: %w: %w", ErrCorrupt, err)
	}
	if len(out)-l != rawLen {
		return dst, fmt.Errorf("zstd: decoded %d bytes, want %d: %w", len(out)-l, rawLen, ErrCorrupt)
	}
	return out, nil
}

// MaxDecodedLen: the densest zstd block is an RLE block, 4 bytes for at most 128 KiB.
func (*zstdCodec) MaxDecodedLen(stored int) int { return (stored/4 + 1) << 17 }
