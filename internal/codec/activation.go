package codec

// Shared parts of the activation codecs (ids 16–63, docs/COMPRESSION.md): the entropy-coded
// plane frame, float conversions that both decoders must reproduce bit for bit, and the
// optional interfaces through which the pipeline asks a lossy codec for its error.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"

	"github.com/strap-llm/strap/internal/dtype"
)

// Activation codec numbers; part of the stream format (docs/COMPRESSION.md).
const (
	// Shuffle is the lossless byte-plane codec.
	Shuffle ID = 16
	// Quant is error-bounded uniform quantization ("abs" or "rel" bound).
	Quant ID = 17
	// FP16 is the range-checked downcast of float32/float64 to float16.
	FP16 ID = 18
	// FP8 is e4m3fn with one float32 scale per row (the tensor's last dimension).
	FP8 ID = 19
)

// Errors returned by the activation codecs.
var (
	// ErrBadBound: a lossy bound is missing, not positive, or of a mode the codec lacks.
	ErrBadBound = errors.New("bad lossy bound")
	// ErrBadLevel: the level is outside what the codec offers.
	ErrBadLevel = errors.New("bad codec level")
)

// BlockStats is the error a codec introduced into one block, measured on the values the
// decoder will produce. Lossless blocks have zero error.
type BlockStats struct {
	// Values is the number of elements in the block.
	Values int
	// MaxAbs is the largest |decoded - original| over finite originals.
	MaxAbs float64
	// SumSqErr is the sum of squared errors over finite originals.
	SumSqErr float64
	// SumSq is the sum of squares of the finite originals (the L2 norm², for rel-L2).
	SumSq float64
	// Lossless is true when the block was stored without loss (range check, bound that
	// could not be met, non-float dtype).
	Lossless bool
	// Rows are the sums of each row part of the block, in order (fp8 only; nil otherwise).
	Rows []RowSums
	// FirstContinues: Rows[0] is the rest of a row whose start is in the previous block.
	FirstContinues bool
	// SharedMisses counts the whole rows a transform block could not code on its module's
	// shared basis within the bound (coded directly instead): the signal to refit the basis.
	SharedMisses int
}

// RowSums are one row's sums over its finite originals x and decoded values y, from which
// its relative L2 error and cosine follow; two parts of a row add up.
type RowSums struct {
	SumSq, SumSqErr, Dot, SumSqDec float64 // Σx², Σ(x−y)², Σxy, Σy²
}

func (r *RowSums) add(o RowSums) {
	r.SumSq += o.SumSq
	r.SumSqErr += o.SumSqErr
	r.Dot += o.Dot
	r.SumSqDec += o.SumSqDec
}

// relL2 is ‖y−x‖/‖x‖ (0 for an all-zero row decoded exactly).
func (r RowSums) relL2() float64 {
	if r.SumSq == 0 {
		if r.SumSqErr == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Sqrt(r.SumSqErr / r.SumSq)
}

// cos is the cosine of x and y (1 when both are zero, 0 when one is).
func (r RowSums) cos() float64 {
	if r.SumSq == 0 && r.SumSqDec == 0 {
		return 1
	}
	if r.SumSq == 0 || r.SumSqDec == 0 {
		return 0
	}
	return r.Dot / math.Sqrt(r.SumSq*r.SumSqDec)
}

// RowPreparer is implemented by codecs that code a tensor by rows of its last dimension
// (fp8: one scale per row). The pipeline calls ForRows, instead of ForTensor, once per
// record with the tensor's last dimension rowLen and, for a PART record, skip = the
// elements of the row its payload starts in that precede the payload (part offset in
// elements mod rowLen; 0 for a whole tensor). It encodes the record's blocks — sub-slices
// tensor[off:off+n] as it cuts them — with the returned codec, which finds each block's
// place in the rows from the slice (a row may span blocks; each part gets its own scale).
type RowPreparer interface {
	ForRows(tensor []byte, dt dtype.DType, rowLen, skip int) (Codec, error)
}

// StatsEncoder is implemented by lossy codecs. The pipeline calls EncodeStats instead of
// Encode so it can record the achieved error in the packet's meta (see ErrorReport).
type StatsEncoder interface {
	// EncodeStats is Encode plus the error the stored block carries. When compressed is
	// false the caller stores src verbatim and the error is zero.
	EncodeStats(dst, src []byte, dt dtype.DType) (out []byte, compressed bool, st BlockStats, err error)
}

// TensorPreparer is implemented by codecs whose parameters depend on the whole tensor
// (the "rel" bound is relative to the tensor's RMS). The pipeline calls ForTensor once per
// tensor, before splitting it into blocks, and encodes that tensor's blocks with the
// returned codec. Skipping the call is safe: each block then uses its own RMS, which keeps
// the bound but compresses less well where blocks differ in scale.
type TensorPreparer interface {
	ForTensor(tensor []byte, dt dtype.DType) (Codec, error)
}

// LossyCodec is implemented by the lossy codecs: Bound is the bound they were built with,
// the one to pass to Report ({Mode: "fp16"} for fp16 without a stated bound).
type LossyCodec interface {
	Bound() LossyBound
}

// ErrorReport is the per-packet error summary the pipeline writes under the key "lossy"
// of a TENSOR packet's meta JSON.
type ErrorReport struct {
	// Mode is the bound's mode: "abs", "rel", "fp16" or "fp8".
	Mode string `json:"mode"`
	// Bound is the bound asked for (0 for "fp16" without a stated bound).
	Bound float64 `json:"bound"`
	// MaxAbsErr is the achieved maximum absolute error.
	MaxAbsErr float64 `json:"max_abs_err"`
	// RelL2Err is the achieved ‖x̂−x‖₂ / ‖x‖₂ (0 when ‖x‖₂ is 0).
	RelL2Err float64 `json:"rel_l2_err"`
	// Blocks is the number of blocks in the packet.
	Blocks int `json:"blocks"`
	// LosslessBlocks counts blocks stored without loss (flagged fallbacks).
	LosslessBlocks int `json:"lossless_blocks"`
	// Rows is the per-row error of the codecs that code by rows (fp8); nil otherwise.
	Rows *RowReport `json:"rows,omitempty"`
}

// RowReport is the distribution of the per-row errors of a packet: relative L2 error
// ‖x̂−x‖/‖x‖ and cosine of x̂ and x per row (a token's vector), over the rows of its lossy
// blocks (rows of blocks stored losslessly are exact and not counted). Percentiles are
// nearest-rank: p50 is the ⌈0.5·n⌉-th smallest value.
type RowReport struct {
	// N is the number of rows measured.
	N int `json:"n"`
	// RelL2Max, RelL2P50, RelL2P99: the largest, median and 99th-percentile row rel-L2.
	RelL2Max float64 `json:"rel_l2_max"`
	RelL2P50 float64 `json:"rel_l2_p50"`
	RelL2P99 float64 `json:"rel_l2_p99"`
	// CosMin, CosP50, CosP01: the smallest, median and 1st-percentile row cosine.
	CosMin float64 `json:"cos_min"`
	CosP50 float64 `json:"cos_p50"`
	CosP01 float64 `json:"cos_p01"`
}

// rank is the nearest-rank p-quantile of sorted v (non-empty).
func rank(v []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// rowReport merges the row parts of blocks (a part that continues the previous block's
// last row is added to it) and summarizes them; nil without rows.
func rowReport(blocks []BlockStats) *RowReport {
	var rows []RowSums
	prevRows := false // the previous block ended with a row part
	for _, b := range blocks {
		for i, r := range b.Rows {
			if i == 0 && b.FirstContinues && prevRows {
				rows[len(rows)-1].add(r)
				continue
			}
			rows = append(rows, r)
		}
		prevRows = len(b.Rows) > 0
	}
	if len(rows) == 0 {
		return nil
	}
	rel := make([]float64, len(rows))
	cos := make([]float64, len(rows))
	for i, r := range rows {
		rel[i], cos[i] = r.relL2(), r.cos()
	}
	slices.Sort(rel)
	slices.Sort(cos)
	return &RowReport{N: len(rows), RelL2Max: rel[len(rel)-1], RelL2P50: rank(rel, 0.5), RelL2P99: rank(rel, 0.99),
		CosMin: cos[0], CosP50: rank(cos, 0.5), CosP01: rank(cos, 0.01)}
}

// Report folds the stats of a packet's blocks into its ErrorReport.
func Report(b LossyBound, blocks []BlockStats) ErrorReport {
	r := ErrorReport{Mode: b.Mode, Bound: b.Value, Blocks: len(blocks)}
	var sse, ss float64
	for _, s := range blocks {
		r.MaxAbsErr = math.Max(r.MaxAbsErr, s.MaxAbs)
		sse += s.SumSqErr
		ss += s.SumSq
		if s.Lossless {
			r.LosslessBlocks++
		}
	}
	if ss > 0 {
		r.RelL2Err = math.Sqrt(sse / ss)
	}
	r.Rows = rowReport(blocks)
	return r
}

// Exceeds reports whether the achieved error is beyond the bound asked for (a bug).
func (r ErrorReport) Exceeds() bool {
	switch r.Mode {
	case "abs":
		return r.MaxAbsErr > r.Bound
	case "rel", "fp16":
		return r.Bound > 0 && r.RelL2Err > r.Bound
	case "fp8", "transform":
		return r.Bound > 0 && (r.RelL2Err > r.Bound || r.Rows != nil && r.Rows.RelL2Max > r.Bound)
	}
	return false
}

// --- plane frames -----------------------------------------------------------------------

// A plane frame is a standard zstd frame (single segment, content size set, no checksum),
// so any zstd decoder reads it. At level 0 its blocks hold only Huffman-coded literals
// (huff0, no match search): the entropy of a byte plane at ~1 GB/s instead of a match
// finder that finds nothing in float data.

const (
	zstdMagic     = 0xFD2FB528
	literalsChunk = 128 << 10 // zstd's maximum block size
	// maxPlane bounds what the plane decoder will allocate for one frame.
	maxPlane = 1 << 30
)

var (
	zencMu sync.Mutex
	zenc   = map[zstd.EncoderLevel]*zstd.Encoder{}
	zdecMu sync.Mutex
	zdec   *zstd.Decoder
)

func zstdEncoder(l zstd.EncoderLevel) (*zstd.Encoder, error) {
	zencMu.Lock()
	defer zencMu.Unlock()
	if e, ok := zenc[l]; ok {
		return e, nil
	}
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(l), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true), zstd.WithSingleSegment(true))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	zenc[l] = e
	return e, nil
}

func zstdDecoder() (*zstd.Decoder, error) {
	zdecMu.Lock()
	defer zdecMu.Unlock()
	if zdec == nil {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
			zstd.WithDecoderMaxMemory(maxPlane), zstd.WithDecoderMaxWindow(maxPlane),
			zstd.WithDecodeAllCapLimit(true), zstd.IgnoreChecksum(true))
		if err != nil {
			return nil, fmt.Errorf("zstd decoder: %w", err)
		}
		zdec = d
	}
	return zdec, nil
}

// appendPlane appends the plane frame of p. Level 0: literal-only frame (huff0); 1–4:
// klauspost zstd at SpeedFastest, SpeedDefault, SpeedBetterCompression, SpeedBestCompression.
func appendPlane(dst, p []byte, level int) ([]byte, error) {
	return appendPlaneCounted(dst, p, level, nil)
}

// appendPlaneCounted is appendPlane given, when cc is not nil, the counts of p (a plane
// of 17 bytes to smallMax-1, counted by a caller that needed them first).
func appendPlaneCounted(dst, p []byte, level int, cc *chunkCounts) ([]byte, error) {
	if level >= 1 {
		e, err := zstdEncoder(zstd.EncoderLevel(level))
		if err != nil {
			return nil, err
		}
		return e.EncodeAll(p, dst), nil
	}
	// Frame header: magic, descriptor 0xA0 (4-byte content size, single segment).
	dst = binary.LittleEndian.AppendUint32(dst, zstdMagic)
	dst = append(dst, 0xA0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p)))
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), literalsChunk)
		chunk := p[:n]
		p = p[n:]
		dst = appendLiteralsBlock(dst, chunk, len(p) == 0, cc)
	}
	return dst, nil
}

func blockHeader(dst []byte, last bool, typ, size int) []byte {
	h := uint32(size)<<3 | uint32(typ)<<1
	if last {
		h |= 1
	}
	return append(dst, byte(h), byte(h>>8), byte(h>>16))
}

// appendLiteralsBlock writes one zstd block holding chunk as Huffman literals and no
// sequences, or as a raw or RLE block when entropy coding does not pay (as zstd does).
func appendLiteralsBlock(dst, chunk []byte, last bool, cc *chunkCounts) []byte {
	var (
		out    []byte
		err    error
		single bool
	)
	switch {
	case len(chunk) >= sampleMin && looksUniform(chunk):
		err = huff0.ErrIncompressible
	case len(chunk) > 16 && len(chunk) < smallMax:
		// One count serves the judgement and the table (huff0 would count again).
		sh := smallHuffPool.Get().(*smallHuff)
		defer smallHuffPool.Put(sh)
		if cc == nil {
			cc = &sh.counts
			cc.count(chunk)
		}
		if cc.looksUniform(len(chunk)) {
			err = huff0.ErrIncompressible
			break
		}
		single = len(chunk) < 1024
		out, err = sh.smallHuffman(chunk, &cc.h)
	case len(chunk) >= smallMax:
		// huff0.Compress4X's bytes from a faster count (see countLarge): on the exponent
		// planes of real activations 5–11 % less time than huff0 from 4 to 128 KiB
		// (BenchmarkLargeHuffman). huff0 itself is no longer called at level 0.
		sh := smallHuffPool.Get().(*smallHuff)
		defer smallHuffPool.Put(sh)
		sh.countLarge(chunk)
		out, err = sh.smallHuffman(chunk, &sh.counts.h)
	default:
		err = huff0.ErrIncompressible
	}
	var (
		lha [5]byte
		lh  []byte
	)
	if err == nil {
		lh = literalsHeader(lha[:0], len(out), len(chunk), single)
		if len(lh)+len(out)+1 >= len(chunk) {
			err = huff0.ErrIncompressible
		}
	}
	switch {
	case err == nil:
		dst = blockHeader(dst, last, 2, len(lh)+len(out)+1)
		dst = append(dst, lh...)
		dst = append(dst, out...)
		return append(dst, 0) // Number_of_Sequences = 0
	case errors.Is(err, huff0.ErrUseRLE):
		dst = blockHeader(dst, last, 1, len(chunk))
		return append(dst, chunk[0])
	default: // incompressible or any other huff0 refusal: raw
		dst = blockHeader(dst, last, 0, len(chunk))
		return append(dst, chunk...)
	}
}

// sampleMin is the smallest chunk looksUniform judges: below it the sample is too small.
const sampleMin = 8 << 10

// looksUniform predicts, from every 8th byte, that Huffman coding cannot shrink chunk by
// more than about 1 %: byte planes of mantissa bits are noise, and counting all their bytes
// (what huff0 does before it refuses them) cost as much as coding the exponent plane. The
// sample costs an eighth of that count. A chunk is judged uniform when the sample's
// entropy is over 7.92 bits a byte, or its commonest value is under 3/4 of huff0's own
// refusal threshold (1/128 of the chunk), about three standard deviations below it.
func looksUniform(chunk []byte) bool {
	var h [256]uint32
	c := chunk
	for len(c) >= 64 {
		h[c[0]]++
		h[c[8]]++
		h[c[16]]++
		h[c[24]]++
		h[c[32]]++
		h[c[40]]++
		h[c[48]]++
		h[c[56]]++
		c = c[64:]
	}
	var mx uint32
	for _, v := range h {
		mx = max(mx, v)
	}
	// 8·mx estimates the full count; compare it with 3/4 of len/128.
	if 32*int(mx) < 3*(len(chunk)>>7) {
		return true
	}
	n := len(chunk) / 64 * 8
	// A value over 1/16 of the sample caps its entropy at 7.83 bits (the rest spread evenly
	// over 255 values): an exponent plane, no need for the logarithms.
	if 16*int(mx) > n {
		return false
	}
	var sum float64 // Σ c·log2(c) over the sample's counts
	for _, v := range h {
		if v > 1 {
			sum += float64(v) * math.Log2(float64(v))
		}
	}
	return math.Log2(float64(n))-sum/float64(n) > 7.92
}

// smallLooksUniform is looksUniform for chunks under smallMax, where a sample would be
// too small but counting every byte is cheap: one-token decode records make 512-byte
// planes, and huff0 sorting and building a table for a mantissa plane it then refuses was
// most of the daemon's CPU per token. It estimates what Huffman coding would send — the
// chunk at its byte entropy (a floor for any prefix code) plus its table — and judges the
// chunk uniform when that is not under 99 % of it.
//
// The table is huff0's list of code-length weights for the symbols 0..max (FSE-coded, or
// 4 bits each): estimated as that list at its own entropy, each symbol's weight taken to be
// the bit length of its count (a symbol's code length is about log2(n/count), so symbols
// whose counts share a bit length share a weight), plus 3 bytes of headers. For a
// near-flat plane of 200 values that is ≈ 60 bytes, which is what huff0 writes; counting a
// byte per 8 values instead (the estimate before issue 38) left huff0 to build and then
// refuse the table of most low mantissa planes of real decode records. TestSmallLooksUniform
// and TestSmallLooksUniformCorpus check the judgement against huff0 itself: a chunk
// judged uniform is one huff0 cannot shrink by 1 %.
//
// From smallMax up huff0 refuses noise itself after its count, before any table (a value
// seen fewer than len/128 times at most), and this estimate would only add its own count.
func smallLooksUniform(chunk []byte) bool {
	var cc chunkCounts
	cc.count(chunk)
	return cc.looksUniform(len(chunk))
}

// chunkCounts is what smallLooksUniform needs of a chunk under smallMax: its counts and
// their sums, taken in one pass over the 256 counts through a table (a branch per symbol,
// mispredicted on every near-flat plane, and a counter in memory per bit length cost as
// much as the count itself).
type chunkCounts struct {
	h   [256]uint32 // each byte value's count
	sum int64       // Σ c·log2(c) over the counts, in fixed point (cLog2C)
	// How many symbols have a count of each bit length (length 0: absent; at most 12 under
	// smallMax), 9 bits a length, lengths 0–6 in lo and 7–13 in hi.
	lo, hi uint64
}

// count sets cc to the counts of chunk (under smallMax bytes).
func (cc *chunkCounts) count(chunk []byte) {
	h := &cc.h
	*h = [256]uint32{}
	for _, b := range chunk {
		h[b]++
	}
	// Two chains each, so consecutive symbols' sums do not wait on each other.
	var sum, sum2 int64
	var lo, hi, lo2, hi2 uint64
	for s := 0; s < 256; s += 2 {
		a, b := &countSums[h[s]&(smallMax-1)], &countSums[h[s+1]&(smallMax-1)]
		sum += a.log
		lo += a.lo
		hi += a.hi
		sum2 += b.log
		lo2 += b.lo
		hi2 += b.hi
	}
	cc.sum, cc.lo, cc.hi = sum+sum2, lo+lo2, hi+hi2
}

// looksUniform is smallLooksUniform's judgement of the n counted bytes.
func (cc *chunkCounts) looksUniform(n int) bool {
	top := 255 // the largest symbol present: weights are listed up to it only
	for cc.h[top] == 0 {
		top--
	}
	const lane = 1<<9 - 1
	k := 256 - int(cc.lo&lane) // symbols present
	m := top + 1
	wsum := cLog2C[m-k] // the absent symbols under top share weight 0
	for c := 1; c < 14; c++ {
		var cnt uint64
		if c < 7 {
			cnt = cc.lo >> (9 * c) & lane
		} else {
			cnt = cc.hi >> (9 * (c - 7)) & lane
		}
		wsum += cLog2C[cnt]
	}
	data := cLog2C[n] - cc.sum // n · entropy, in bits
	table := cLog2C[m] - wsum  // the weights at their entropy, in bits
	// Judged uniform when data/8 + table/8 + 3 bytes of headers ≥ 0.99 n. In integers:
	// exact, and the same on every machine, so the judgement is a function of the chunk alone.
	return 100*(data+table+24<<fracBits) >= 99*8*int64(n)<<fracBits
}

// countSums[c] is what a symbol of count c adds to chunkCounts' sums.
var countSums = func() (t [smallMax]struct {
	log    int64
	lo, hi uint64
}) {
	for c := range smallMax {
		t[c].log = cLog2C[c]
		if b := bits.Len(uint(c)); b < 7 {
			t[c].lo = 1 << (9 * b)
		} else {
			t[c].hi = 1 << (9 * (b - 7))
		}
	}
	return t
}()

// smallMax bounds the chunks smallLooksUniform judges (see there).
const smallMax = 4096

// fracBits is the fraction of cLog2C's fixed point.
const fracBits = 16

// cLog2C[c] is c·log2(c) in fixed point (fracBits), for the counts of a chunk under smallMax.
var cLog2C = func() (t [smallMax]int64) {
	for c := 2; c < smallMax; c++ {
		t[c] = int64(math.Round(float64(c) * math.Log2(float64(c)) * (1 << fracBits)))
	}
	return t
}()

// literalsHeader appends the zstd Literals_Section_Header of a Compressed_Literals_Block
// to dst (3 to 5 bytes: a caller's array keeps it off the heap, once per coded plane).
func literalsHeader(dst []byte, compLen, regen int, single bool) []byte {
	const typ = 2
	switch {
	case regen < 1<<10 && compLen < 1<<10:
		sf := uint64(1)
		if single {
			sf = 0
		}
		h := typ | sf<<2 | uint64(regen)<<4 | uint64(compLen)<<14
		return append(dst, byte(h), byte(h>>8), byte(h>>16))
	case regen < 1<<14 && compLen < 1<<14:
		h := typ | 2<<2 | uint64(regen)<<4 | uint64(compLen)<<18
		return append(dst, byte(h), byte(h>>8), byte(h>>16), byte(h>>24))
	default:
		h := typ | 3<<2 | uint64(regen)<<4 | uint64(compLen)<<22
		return append(dst, byte(h), byte(h>>8), byte(h>>16), byte(h>>24), byte(h>>32))
	}
}

// decodePlane decodes the plane frame f into out, which must have length exactly the
// plane's size. The frame must declare that size, and the decoder may not write past
// cap(out) (WithDecodeAllCapLimit), so corrupt input cannot make it allocate or loop more.
func decodePlane(out, f []byte) error {
	n := len(out)
	var h zstd.Header
	if err := h.Decode(f); err != nil {
		return fmt.Errorf("plane frame: %w: %w", ErrCorrupt, err)
	}
	if !h.HasFCS || h.FrameContentSize != uint64(n) {
		return fmt.Errorf("plane frame declares %d bytes, want %d: %w", h.FrameContentSize, n, ErrCorrupt)
	}
	d, err := zstdDecoder()
	if err != nil {
		return err
	}
	got, err := d.DecodeAll(f, out[:0:n])
	if err != nil {
		return fmt.Errorf("plane frame: %w: %w", ErrCorrupt, err)
	}
	if len(got) != n || (n > 0 && &got[0] != &out[0]) {
		return fmt.Errorf("plane frame gave %d bytes, want %d: %w", len(got), n, ErrCorrupt)
	}
	return nil
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n)
	copy(nb, b)
	return nb
}

// appendPlanes writes the plane table (count × u32 frame length) and the frames of planes.
func appendPlanes(dst []byte, planes [][]byte, level int) ([]byte, error) {
	return appendPlanesCounted(dst, planes, level, nil)
}

// appendPlanesCounted is appendPlanes given, when last is not nil, the counts of the last
// plane (see appendPlaneCounted).
func appendPlanesCounted(dst []byte, planes [][]byte, level int, last *chunkCounts) ([]byte, error) {
	tab := len(dst)
	dst = append(dst, make([]byte, 4*len(planes))...)
	for j, p := range planes {
		start := len(dst)
		var cc *chunkCounts
		if j == len(planes)-1 {
			cc = last
		}
		var err error
		if dst, err = appendPlaneCounted(dst, p, level, cc); err != nil {
			return nil, err
		}
		binary.LittleEndian.PutUint32(dst[tab+4*j:], uint32(len(dst)-start))
	}
	return dst, nil
}

// readPlanes decodes k planes of n bytes each from src (plane table then frames) into one
// buffer of k·n bytes, and returns the bytes of src after the last frame.
func readPlanes(src []byte, k, n int) (planes, rest []byte, err error) {
	if len(src) < 4*k {
		return nil, nil, fmt.Errorf("plane table: %w", ErrCorrupt)
	}
	off := 4 * k
	planes = make([]byte, k*n)
	for j := range k {
		fl := int(binary.LittleEndian.Uint32(src[4*j:]))
		if fl > len(src)-off {
			return nil, nil, fmt.Errorf("plane %d overruns block: %w", j, ErrCorrupt)
		}
		if err = decodePlane(planes[j*n:(j+1)*n], src[off:off+fl]); err != nil {
			return nil, nil, fmt.Errorf("plane %d: %w", j, err)
		}
		off += fl
	}
	return planes, src[off:], nil
}

// --- floats ------------------------------------------------------------------------------

// f16Table widens every fp16 bit pattern (256 KiB, built once at init).
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = dtype.Float16ToFloat32(uint16(h))
	}
	return &t
}()

// loadFloat reads element i of a float block as float64 (exact for every float dtype here).
func loadFloat(src []byte, dt dtype.DType, i int) float64 {
	switch dt {
	case dtype.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
	case dtype.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:]))
	case dtype.Float16:
		return float64(dtype.Float16ToFloat32(binary.LittleEndian.Uint16(src[2*i:])))
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(binary.LittleEndian.Uint16(src[2*i:])))
	}
	panic("codec: loadFloat on " + dt.String())
}

// quantizable reports whether the lossy codecs handle dt (others are stored losslessly).
func quantizable(dt dtype.DType) bool {
	switch dt {
	case dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16:
		return true
	}
	return false
}

// sumSquares returns the element count and sum of squares of the finite values of src.
func sumSquares(src []byte, dt dtype.DType) (n int, ss float64) {
	cnt := len(src) / dt.Size()
	if dt == dtype.Float32 {
		src = src[:4*cnt]
		for i := range cnt {
			x := float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
			if x-x == 0 { // finite
				ss += x * x
				n++
			}
		}
		return n, ss
	}
	for i := range cnt {
		x := loadFloat(src, dt, i)
		if !math.IsInf(x, 0) && !math.IsNaN(x) {
			ss += x * x
			n++
		}
	}
	return n, ss
}
