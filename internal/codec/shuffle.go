package codec

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/strap-llm/strap/internal/dtype"
)

// The shuffle codec (id 16) is lossless: each element (sign bit rotated to the bottom for
// floats, so one byte plane holds the exponent) is split into byte planes, and each plane
// is entropy-coded as a zstd frame (docs/COMPRESSION.md section 2).

func init() {
	Register("shuffle", Shuffle, func(o Options) (Codec, error) {
		if o.Lossy != nil {
			return nil, fmt.Errorf("shuffle: %w", ErrLossyOption)
		}
		if o.Level < 0 || o.Level > 4 {
			return nil, fmt.Errorf("shuffle level %d (0–4): %w", o.Level, ErrBadLevel)
		}
		return shuffleCodec{level: o.Level}, nil
	})
}

type shuffleCodec struct{ level int }

func (shuffleCodec) ID() ID           { return Shuffle }
func (shuffleCodec) Name() string     { return "shuffle" }
func (c shuffleCodec) Level() int     { return c.level }
func (c shuffleCodec) String() string { return fmt.Sprintf("shuffle(level %d)", c.level) }

func (c shuffleCodec) Encode(dst, src []byte, dt dtype.DType) ([]byte, bool, error) {
	out, err := appendShuffled(dst, src, dt, c.level)
	if err != nil {
		return nil, false, fmt.Errorf("shuffle: %w", err)
	}
	if len(out)-len(dst) >= len(src) {
		return dst, false, nil
	}
	return out, true, nil
}

func (c shuffleCodec) Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	out, err := decodeShuffled(dst, src, dt, rawLen)
	if err != nil {
		return nil, fmt.Errorf("shuffle: %w", err)
	}
	return out, nil
}

// shuffleScratch is the per-call working memory of the encoder, pooled so a block costs
// no allocation: the plane buffer, and the zero map's bitmap and compacted elements.
type shuffleScratch struct {
	planes, bitmap, compact []byte
	top                     chunkCounts // the last plane's counts, when counted first
}

var shufflePool = sync.Pool{New: func() any { return new(shuffleScratch) }}

// sized returns b resized to n bytes, reallocated only when its capacity is short.
func sized(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// rotates reports whether elements of dt have their sign bit rotated to bit 0.
func rotates(dt dtype.DType) bool {
	return dt.IsFloat() && dt.Size() > 1
}

const (
	// flagZeroMap: the payload has a bitmap of the elements whose bytes are all zero, and the
	// planes hold only the other elements.
	flagZeroMap = 1
	// zeroMapShare: a zero map is written when at least 1/zeroMapShare of the elements are
	// zero (ReLU outputs, masks, padding); below that it costs more than it saves.
	zeroMapShare = 16
)

// countZeros counts the elements of src (width w) whose bytes are all zero, looking at
// every stride-th element only.
func countZeros(src []byte, w, stride int) int {
	z, step := 0, w*stride
	switch w {
	case 2:
		for i := 0; i+2 <= len(src); i += step {
			if binary.LittleEndian.Uint16(src[i:]) == 0 {
				z++
			}
		}
	case 4:
		for i := 0; i+4 <= len(src); i += step {
			if binary.LittleEndian.Uint32(src[i:]) == 0 {
				z++
			}
		}
	case 8:
		for i := 0; i+8 <= len(src); i += step {
			if binary.LittleEndian.Uint64(src[i:]) == 0 {
				z++
			}
		}
	default:
		for i := 0; i+w <= len(src); i += step {
			if allZero(src[i : i+w]) {
				z++
			}
		}
	}
	return z
}

// zeroMapLikely reports whether a zero map may pay: under 1024 elements an exact count of
// the zeros decides (it costs a fraction of compacting, and most small decode records have
// no zeros, so compacting them to find out was a pass per record for nothing); from 1024 a
// sample of every 8th element decides whether compacting the block, which also counts its
// zeros, is worth its pass. Either way the decision is a function of the block alone.
func zeroMapLikely(body []byte, w, n int) bool {
	if w < 2 || n == 0 {
		return false
	}
	need := max(1, n/zeroMapShare)
	if n < 1024 {
		return countZeros(body, w, 1) >= need
	}
	return 8*countZeros(body, w, 8) >= need/2
}

// compactNonZero sets bit i of bitmap for every all-zero element i of body (width w),
// copies the other elements in order into compact (at least len(body) bytes) and returns
// their number. The 2- and 4-byte loops have no branch on the data: each element is
// stored at the compacted position, which advances only past a non-zero one.
func compactNonZero(bitmap, compact, body []byte, w int) int {
	n, k := len(body)/w, 0
	compact = compact[:len(body)]
	for i := 0; i < n; i += 8 {
		var bm byte
		end := min(n, i+8)
		switch w {
		case 2:
			for j := i; j < end; j++ {
				v := binary.LittleEndian.Uint16(body[2*j:])
				binary.LittleEndian.PutUint16(compact[2*k:], v)
				z := (uint32(v) - 1) >> 31
				bm |= byte(z) << (j - i)
				k += int(z ^ 1)
			}
		case 4:
			for j := i; j < end; j++ {
				v := binary.LittleEndian.Uint32(body[4*j:])
				binary.LittleEndian.PutUint32(compact[4*k:], v)
				z := (uint64(v) - 1) >> 63
				bm |= byte(z) << (j - i)
				k += int(z ^ 1)
			}
		default:
			for j := i; j < end; j++ {
				e := body[j*w : (j+1)*w]
				if allZero(e) {
					bm |= 1 << (j - i)
				} else {
					copy(compact[k*w:], e)
					k++
				}
			}
		}
		bitmap[i>>3] = bm
	}
	return k
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// appendShuffled appends the shuffle payload of src (elements of dt) to dst.
func appendShuffled(dst, src []byte, dt dtype.DType, level int) ([]byte, error) {
	w := dt.Size()
	if w == 0 {
		return nil, fmt.Errorf("dtype %d: %w", uint8(dt), ErrCorrupt)
	}
	n := len(src) / w
	body, m := src[:n*w], n
	sc := shufflePool.Get().(*shuffleScratch)
	defer shufflePool.Put(sc)
	var flags byte
	fi := len(dst)
	dst = append(dst, 0)
	var top *chunkCounts
	if level == 0 && w >= 2 && n > 16 && n < smallMax {
		// Small blocks (one-token decode records) are shuffled and their last plane counted
		// first: an all-zero element puts a 0 in every plane, so fewer 0s in it than a zero
		// map needs rule the map out without counting zeros (for floats that plane is the
		// exponent's, where only zeros and subnormals have a 0), and its frame needs that
		// count anyway. Otherwise the zero map is decided as for any block; either way it
		// is written exactly when the block has n/zeroMapShare zeros.
		sc.planes = sized(sc.planes, n*w)
		shuffle(sc.planes, body, w, rotates(dt))
		top = &sc.top
		top.count(sc.planes[(w-1)*n:])
		if int(top.h[0]) >= max(1, n/zeroMapShare) {
			top = nil
		}
	}
	if top == nil && zeroMapLikely(body, w, n) {
		sc.bitmap = sized(sc.bitmap, (n+7)/8)
		sc.compact = sized(sc.compact, n*w)
		if k := compactNonZero(sc.bitmap, sc.compact, body, w); n-k >= max(1, n/zeroMapShare) {
			flags |= flagZeroMap
			m = k
			dst = binary.LittleEndian.AppendUint32(dst, uint32(m))
			var err error
			if dst, err = appendPlanes(dst, [][]byte{sc.bitmap}, level); err != nil {
				return nil, err
			}
			body = sc.compact[:m*w]
		}
	}
	dst[fi] = flags
	if top == nil {
		sc.planes = sized(sc.planes, m*w)
		shuffle(sc.planes, body, w, rotates(dt))
	}
	buf := sc.planes
	var pa [8][]byte
	planes := pa[:0]
	if w > len(pa) {
		planes = make([][]byte, 0, w)
	}
	for j := range w {
		planes = append(planes, buf[j*m:(j+1)*m])
	}
	dst, err := appendPlanesCounted(dst, planes, level, top)
	if err != nil {
		return nil, err
	}
	return append(dst, src[n*w:]...), nil
}

// decodeShuffled appends the rawLen bytes of a shuffle payload to dst.
func decodeShuffled(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	w := dt.Size()
	if w == 0 || rawLen < 0 || rawLen > MaxBlockSize {
		return nil, fmt.Errorf("dtype %d, raw length %d: %w", uint8(dt), rawLen, ErrCorrupt)
	}
	n := rawLen / w
	if len(src) < 1 || src[0]&^flagZeroMap != 0 {
		return nil, fmt.Errorf("shuffle flags: %w", ErrCorrupt)
	}
	flags, src := src[0], src[1:]
	m := n
	var bitmap []byte
	if flags&flagZeroMap != 0 {
		if len(src) < 4 {
			return nil, fmt.Errorf("zero map header: %w", ErrCorrupt)
		}
		m = int(binary.LittleEndian.Uint32(src))
		if m > n {
			return nil, fmt.Errorf("%d non-zero elements of %d: %w", m, n, ErrCorrupt)
		}
		var err error
		if bitmap, src, err = readPlanes(src[4:], 1, (n+7)/8); err != nil {
			return nil, fmt.Errorf("zero map: %w", err)
		}
		zeros := 0
		for _, b := range bitmap {
			zeros += bits.OnesCount8(b)
		}
		if zeros != n-m || (n%8 != 0 && bitmap[n/8]>>(n%8) != 0) {
			return nil, fmt.Errorf("zero map counts %d zeros, want %d: %w", zeros, n-m, ErrCorrupt)
		}
	}
	planes, rest, err := readPlanes(src, w, m)
	if err != nil {
		return nil, err
	}
	if len(rest) != rawLen-n*w {
		return nil, fmt.Errorf("tail is %d bytes, want %d: %w", len(rest), rawLen-n*w, ErrCorrupt)
	}
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start : start+n*w]
	if bitmap == nil {
		unshuffle(out, planes, w, rotates(dt))
	} else {
		vals := make([]byte, m*w)
		unshuffle(vals, planes, w, rotates(dt))
		for i, k := 0, 0; i < n; i++ {
			e := out[i*w : (i+1)*w]
			if bitmap[i>>3]&(1<<(i&7)) != 0 {
				clear(e)
			} else {
				copy(e, vals[k*w:(k+1)*w])
				k++
			}
		}
	}
	copy(dst[start+n*w:], rest)
	return dst, nil
}

// shuffle writes the w byte planes of the n = len(src)/w elements of src into buf, plane j
// at buf[j·n:(j+1)·n].
func shuffle(buf, src []byte, w int, rot bool) {
	n := len(src) / w
	switch {
	case w == 4:
		p0, p1, p2, p3 := buf[:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:4*n]
		k := shuffle4Vec(p0, p1, p2, p3, src, rot)
		shuffle4(p0[k:], p1[k:], p2[k:], p3[k:], src[4*k:], rot)
	case w == 2:
		p0, p1 := buf[:n], buf[n:2*n]
		k := shuffle2Vec(p0, p1, src, rot)
		shuffle2(p0[k:], p1[k:], src[2*k:], rot)
	case w == 8:
		for i := range n {
			v := binary.LittleEndian.Uint64(src[8*i:])
			if rot {
				v = bits.RotateLeft64(v, 1)
			}
			for j := range 8 {
				buf[j*n+i] = byte(v >> (8 * j))
			}
		}
	default:
		for i := range n {
			for j := range w {
				buf[j*n+i] = src[w*i+j]
			}
		}
	}
}

// unshuffle is the inverse of shuffle.
func unshuffle(dst, buf []byte, w int, rot bool) {
	n := len(dst) / w
	switch {
	case w == 4:
		unshuffle4(dst, buf[:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:4*n], rot)
	case w == 2:
		unshuffle2(dst, buf[:n], buf[n:2*n], rot)
	case w == 8:
		for i := range n {
			var v uint64
			for j := range 8 {
				v |= uint64(buf[j*n+i]) << (8 * j)
			}
			if rot {
				v = bits.RotateLeft64(v, -1)
			}
			binary.LittleEndian.PutUint64(dst[8*i:], v)
		}
	default:
		for i := range n {
			for j := range w {
				dst[w*i+j] = buf[j*n+i]
			}
		}
	}
}
