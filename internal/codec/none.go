package codec

import (
	"fmt"

	"github.com/strap-llm/strap/internal/dtype"
)

func init() {
	Register("none", None, func(o Options) (Codec, error) {
		if o.Lossy != nil {
			return nil, fmt.Errorf("none: %w", ErrLossyOption)
		}
		if o.Level != 0 {
			return nil, fmt.Errorf("none: level %d: %w", o.Level, ErrBadLevel)
		}
		return noneCodec{}, nil
	})
}

// noneCodec stores bytes as they are. Packets with codec none have no block table: the
// writer puts the raw slices straight into the stream.
type noneCodec struct{}

func (noneCodec) ID() ID       { return None }
func (noneCodec) Name() string { return "none" }

// Encode appends src itself: the stored form of codec none is the raw bytes.
func (noneCodec) Encode(dst, src []byte, _ dtype.DType) ([]byte, bool, error) {
	return append(dst, src...), true, nil
}

func (noneCodec) Decode(dst, src []byte, _ dtype.DType, rawLen int) ([]byte, error) {
	if len(src) != rawLen {
		return dst, fmt.Errorf("none: %d stored bytes for %d raw: %w", len(src), rawLen, ErrCorrupt)
	}
	return append(dst, src...), nil
}

// MaxDecodedLen: codec none never expands.
func (noneCodec) MaxDecodedLen(stored int) int { return stored }
