package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/strap-llm/strap/internal/dtype"
)

// A basis shared by a module's records (COMPRESSION.md 5.3): fitted once from the first
// record's rows, stored once as a basis packet (transform mode 3), then used by every block of
// the module (mode 4), which names it by the crc32 of the packet. A block's bytes are then a
// function of the block and the basis packet; whoever holds the packet (the pipeline at
// dispatch, a reader that found it in the stream) can code or decode any block alone.
//
// Why a full rotation and not a few vectors: on MiniLM a per-row bound leaves too little of a
// row's budget for what k ≪ d vectors drop (section 10.2), while a full d×d rotation drops
// nothing, so every row is coded on it and its error is only the coefficients' rounding;
// the trailing components of a row are mostly zero integers, which cost almost nothing in
// their own Huffman table (a table per band of 16 components).

const (
	// modeBasis is the mode byte of a basis packet; modeShared of a block coded on one.
	modeBasis  = 3
	modeShared = 4
	// maxSharedBasis bounds a shared basis' vectors: |c| < 2²³, |B| < 2¹⁵ and k ≤ 2¹¹ keep
	// every partial sum of k products below 2⁴⁹, exact in float64 in any order.
	maxSharedBasis = 2048
	// maxSharedEntries bounds k·d (what a basis packet makes a reader allocate).
	maxSharedEntries = 1 << 22
	// sharedBand is the components per coefficient band (one Huffman table each).
	sharedBand = 16
	// sharedHeader is mode, row_len, first, k, groups, crc32.
	sharedHeader = 1 + 4 + 4 + 2 + 1 + 4
	// sharedFitRows is the most rows a basis is fitted from.
	sharedFitRows = 4096
	// sharedMargin: the coefficients' rounding error may take this share of a row's squared
	// budget (the rest is for the basis' own rounding and the dtype's; every row is verified).
	sharedMargin = 0.99
)

// ErrNeedBasis: a transform block was coded on a module's shared basis (mode 4) and the
// decoder was not given that basis packet (or was given another one).
var ErrNeedBasis = errors.New("transform block needs its shared basis")

// SharedBasis is a module's basis for transform mode 4: d-dimensional rows, k ≤ d orthonormal
// vectors stored as int16 at scale 2^-shift, and the rows' mean; Packet is what is stored.
type SharedBasis struct {
	tb     tBasis
	packet []byte
	crc    uint32
}

// Dim is the row length the basis codes.
func (sb *SharedBasis) Dim() int { return sb.tb.d }

// K is the number of basis vectors.
func (sb *SharedBasis) K() int { return sb.tb.k }

// Packet is the basis packet (transform mode 3, COMPRESSION.md 5.3), to be stored once before
// the first block coded on it.
func (sb *SharedBasis) Packet() []byte { return sb.packet }

// CRC is the crc32 (IEEE) of Packet, which every mode-4 block coded on it carries.
func (sb *SharedBasis) CRC() uint32 { return sb.crc }

// FitSharedBasis fits a module's basis from the whole rows (rowLen values each) of src, a
// tensor of dt, for a per-row rel-L2 bound: the rows' mean, their principal directions
// (the range finder of the per-block basis on up to 1024 rows) completed to a full rotation
// of the row space, each vector rounded to int16 at a scale chosen from the bound as for the
// per-block basis. The result is a function of src's bytes, rowLen and bound.
func FitSharedBasis(src []byte, dt dtype.DType, rowLen int, bound float64) (*SharedBasis, error) {
	w := dt.Size()
	if !fp8Able(dt) || len(src)%w != 0 {
		return nil, fmt.Errorf("shared basis of %s: %w", dt, ErrBadBound)
	}
	if rowLen < 8 || rowLen > maxSharedBasis || !(bound > 0 && bound < 1) {
		return nil, fmt.Errorf("shared basis for rows of %d, bound %g: %w", rowLen, bound, ErrBadBound)
	}
	d := rowLen
	nr := len(src) / w / d
	if nr < minBasisRows {
		return nil, fmt.Errorf("shared basis from %d rows (want %d): %w", nr, minBasisRows, ErrBadBound)
	}
	mean64 := make([]float64, d)
	for r := range nr {
		for i := range d {
			v := loadFloat(src, dt, r*d+i)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("shared basis from a row with NaN or inf: %w", ErrBadBound)
			}
			mean64[i] += v
		}
	}
	tb := tBasis{d: d, mean: make([]float32, d)}
	for i := range d {
		tb.mean[i] = float32(mean64[i] / float64(nr))
	}
	m := min(nr, sharedFitRows)
	rows := make([]float64, m*d)
	for s := range m {
		r := s * nr / m
		for i := range d {
			rows[s*d+i] = loadFloat(src, dt, r*d+i) - float64(tb.mean[i])
		}
	}
	vecs := principal(rows, m, d, min(m, d, 512))
	// Complete to a rotation: the unit vectors, orthonormalized against what is there.
	full := make([]float64, len(vecs), len(vecs)+d*d)
	copy(full, vecs)
	for i := range d {
		e := make([]float64, d)
		e[i] = 1
		full = append(full, e...)
	}
	full = orthonormalize(full, d)
	k := min(len(full)/d, d)
	tb.shift = min(max(int(math.Ceil(math.Log2(math.Sqrt(float64(d)/12)/(0.05*bound)))), 8), 15)
	tb.k, tb.l = k, k
	tb.b = make([]int32, k*d)
	tb.v = make([]float64, k*d)
	sc := math.Ldexp(1, tb.shift)
	for i, v := range full[:k*d] {
		r := min(max(math.RoundToEven(v*sc), -32767), 32767)
		tb.b[i] = int32(r)
		tb.v[i] = r / sc
	}
	pkt := []byte{modeBasis}
	pkt = binary.LittleEndian.AppendUint32(pkt, uint32(d))
	pkt = binary.LittleEndian.AppendUint16(pkt, uint16(k))
	pkt = append(pkt, byte(tb.shift))
	for _, f := range tb.mean {
		pkt = binary.LittleEndian.AppendUint32(pkt, math.Float32bits(f))
	}
	pkt, err := appendBasis(pkt, tb.b)
	if err != nil {
		return nil, fmt.Errorf("shared basis: %w", err)
	}
	return &SharedBasis{tb: tb, packet: pkt, crc: crc32.ChecksumIEEE(pkt)}, nil
}

// ParseSharedBasis reads a basis packet (transform mode 3) as FitSharedBasis wrote it.
func ParseSharedBasis(pkt []byte) (*SharedBasis, error) {
	const hl = 1 + 4 + 2 + 1
	if len(pkt) < hl || pkt[0] != modeBasis {
		return nil, fmt.Errorf("basis packet header: %w", ErrCorrupt)
	}
	d := int(binary.LittleEndian.Uint32(pkt[1:]))
	k := int(binary.LittleEndian.Uint16(pkt[5:]))
	shift := int(pkt[7])
	if d < 1 || k < 1 || k > d || k > maxSharedBasis || k*d > maxSharedEntries || shift > 15 {
		return nil, fmt.Errorf("basis of %d vectors of %d, shift %d: %w", k, d, shift, ErrCorrupt)
	}
	if len(pkt) < hl+4*d {
		return nil, fmt.Errorf("basis mean: %w", ErrCorrupt)
	}
	tb := tBasis{d: d, k: k, l: k, shift: shift, mean: make([]float32, d)}
	for i := range d {
		f := math.Float32frombits(binary.LittleEndian.Uint32(pkt[hl+4*i:]))
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, fmt.Errorf("basis mean %d: %g: %w", i, f, ErrCorrupt)
		}
		tb.mean[i] = f
	}
	pl, rest, err := readPlanes(pkt[hl+4*d:], 2, k*d)
	if err != nil {
		return nil, fmt.Errorf("basis: %w", err)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d bytes after the basis: %w", len(rest), ErrCorrupt)
	}
	kn := k * d
	tb.b = make([]int32, kn)
	tb.v = make([]float64, kn)
	sc := math.Ldexp(1, -shift)
	for i := range kn {
		z := uint32(pl[i]) | uint32(pl[kn+i])<<8
		if z == 0xFFFF {
			return nil, fmt.Errorf("basis value %d out of range: %w", i, ErrCorrupt)
		}
		tb.b[i] = int32(z>>1) ^ -int32(z&1)
		tb.v[i] = float64(tb.b[i]) * sc
	}
	return &SharedBasis{tb: tb, packet: pkt, crc: crc32.ChecksumIEEE(pkt)}, nil
}

// BasisUser is implemented by codecs that can code a module's blocks on its shared basis
// (transform). The returned codec writes mode-4 blocks for rows of the basis' dimension and
// decodes them (with every other mode of the codec); blocks of other rows are coded as before.
type BasisUser interface {
	WithBasis(sb *SharedBasis) Codec
}

// WithBasis implements BasisUser.
func (c *transformCodec) WithBasis(sb *SharedBasis) Codec {
	cc := *c
	cc.shared = sb
	return &cc
}

// DecodeShared decodes a transform block of any mode, a mode-4 block on sb (nil: a mode-4
// block fails with ErrNeedBasis).
func DecodeShared(dst, src []byte, dt dtype.DType, rawLen int, sb *SharedBasis) ([]byte, error) {
	if len(src) > 0 && src[0] == modeShared {
		out, err := decodeSharedBlock(dst, src, dt, rawLen, sb)
		if err != nil {
			return nil, fmt.Errorf("transform: %w", err)
		}
		return out, nil
	}
	if len(src) > 0 && src[0] == modeBasis {
		return nil, fmt.Errorf("transform: a basis packet is not a data block: %w", ErrCorrupt)
	}
	return (&transformCodec{}).Decode(dst, src, dt, rawLen)
}

// encodeShared codes a block on the shared basis (mode 4): every whole row whose coefficients
// keep it within the bound on the basis, the others directly. A block of other rows, or one
// the basis carries for fewer than half its whole rows and that is smaller without it, is
// coded as without a shared basis.
func (c *transformCodec) encodeShared(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	sb := c.shared
	w := dt.Size()
	if !fp8Able(dt) || len(src)%w != 0 || len(src) == 0 {
		return encodeLossless(dst, src, dt, 0)
	}
	n := len(src) / w
	rowLen, first, cont := c.rows.locate(src, w, n)
	if rowLen != sb.tb.d {
		return c.encodePlain(dst, src, dt)
	}
	x := make([]float64, n)
	for i := range n {
		v := loadFloat(src, dt, i)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return encodeLossless(dst, src, dt, 0)
		}
		x[i] = v
	}
	parts, full := rowParts(n, rowLen, first, cont)
	used := sb.codeRows(x, parts, full, dt, c.relL2)
	st := BlockStats{Values: n, Rows: make([]RowSums, len(parts)), FirstContinues: cont, SharedMisses: len(full) - used}
	for g := range parts {
		p := &parts[g]
		if p.kind != partBasis && !codeDirect(p, x[p.lo:p.hi], dt, c.relL2) {
			return encodeLossless(dst, src, dt, 0)
		}
		st.Rows[g] = p.sums
		st.SumSq += p.sums.SumSq
		st.SumSqErr += p.sums.SumSqErr
		st.MaxAbs = max(st.MaxAbs, p.maxAbs)
	}
	out, err := appendTransformShared(dst, parts, sb, rowLen, first)
	if err != nil {
		return nil, false, st, fmt.Errorf("transform: %w", err)
	}
	if 2*used < len(full) {
		alt, ok, st2, err := c.encodePlain(nil, src, dt)
		if err != nil {
			return nil, false, st, err
		}
		if ok && len(alt) < len(out)-len(dst) {
			st2.SharedMisses = st.SharedMisses
			return append(out[:len(dst)], alt...), true, st2, nil
		}
	}
	if len(out)-len(dst) >= len(src) {
		return encodeLossless(dst, src, dt, 0)
	}
	return out, true, st, nil
}

// rowParts cuts a block of n values into row parts and lists the whole rows.
func rowParts(n, rowLen, first int, cont bool) (parts []tPart, full []int) {
	groups := 1 + (n-first+rowLen-1)/rowLen
	parts = make([]tPart, groups)
	for g := range groups {
		lo, hi := partBounds(g, first, rowLen, n)
		parts[g] = tPart{lo: lo, hi: hi}
		if hi-lo == rowLen && !(g == 0 && cont) {
			full = append(full, g)
		}
	}
	return parts, full
}

// codeRows codes every whole row it can on the shared basis at the largest step that keeps it
// within the bound (searched on the coefficients' rounding error, then verified on the
// decoded values); it returns how many rows it coded.
func (sb *SharedBasis) codeRows(x []float64, parts []tPart, full []int, dt dtype.DType, bound float64) int {
	tb := &sb.tb
	d, k := tb.d, tb.k
	acc := make([]float64, d)
	cen := make([]float64, d)
	coef := make([]float64, k)
	ints := make([]int32, k)
	used := 0
	for _, g := range full {
		p := &parts[g]
		row := x[p.lo:p.hi]
		var ss, cs, kept float64
		for i, v := range row {
			cen[i] = v - float64(tb.mean[i])
			ss += v * v
			cs += cen[i] * cen[i]
		}
		for j := range k {
			coef[j] = dot(cen, tb.v[j*d:(j+1)*d])
			kept += coef[j] * coef[j]
		}
		target := sharedMargin*bound*bound*ss - max(0, cs-kept)
		if ss == 0 || !(target > 0.15*sharedMargin*bound*bound*ss) {
			continue
		}
		// rounding error of the coefficients at step s
		errAt := func(s float64) float64 {
			inv := 1 / s
			var e float64
			for _, v := range coef {
				r := v - s*math.RoundToEven(v*inv)
				e += r * r
			}
			return e
		}
		q := math.Sqrt(12 * target / float64(k))
		for errAt(q) > target && q > 0 {
			q *= 0.9
		}
		// Components under the step round to zero with less error than q²/12: the budget
		// they leave allows a larger step.
		for range 40 {
			if errAt(q*1.05) > target {
				break
			}
			q *= 1.05
		}
		for try := 0; try < 12; try, q = try+1, q*0.97 {
			s := float32(q)
			if !(s >= 0x1p-126) || math.IsInf(float64(s), 0) {
				break
			}
			inv := 1 / float64(s)
			ok := true
			for j, v := range coef {
				r := math.RoundToEven(v * inv)
				if !(math.Abs(r) <= maxInt) {
					ok = false
					break
				}
				ints[j] = int32(r)
			}
			if !ok {
				break
			}
			sums, mx := tb.reconstruct(acc, ints, s, row, dt)
			if sums.SumSqErr <= bound*bound*sums.SumSq {
				p.kind, p.step, p.ints, p.sums, p.maxAbs = partBasis, s, append([]int32(nil), ints...), sums, mx
				used++
				break
			}
		}
	}
	return used
}

// appendTransformShared writes a mode-4 block (COMPRESSION.md 5.3).
func appendTransformShared(dst []byte, parts []tPart, sb *SharedBasis, rowLen, first int) ([]byte, error) {
	// k: the components up to the last band holding a non-zero coefficient.
	k := 0
	for _, p := range parts {
		if p.kind == partBasis {
			for j := len(p.ints) - 1; j >= k; j-- {
				if p.ints[j] != 0 {
					k = j + 1
					break
				}
			}
		}
	}
	k = min(sb.tb.k, (k+sharedBand-1)/sharedBand*sharedBand)
	ng, grp := chooseGroups(parts, rowLen)
	var nb, nw int
	var edge []uint32
	for _, p := range parts {
		switch {
		case p.kind == partBasis:
			nb++
		case p.kind == partDirect && p.hi-p.lo == rowLen:
			nw++
		case p.kind == partDirect:
			for _, v := range p.ints {
				edge = append(edge, zigzag(v))
			}
		}
	}
	dst = append(dst, modeShared)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(rowLen))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(first))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(k))
	dst = append(dst, byte(ng))
	dst = binary.LittleEndian.AppendUint32(dst, sb.crc)
	dst, err := appendGroupsAndParts(dst, grp, ng, rowLen, parts)
	if err != nil {
		return nil, err
	}
	// The bands: component j of every basis part in part order, j by j.
	for b0 := 0; b0 < k; b0 += sharedBand {
		run := make([]uint32, 0, sharedBand*nb)
		for j := b0; j < min(k, b0+sharedBand); j++ {
			for _, p := range parts {
				if p.kind == partBasis {
					run = append(run, zigzag(p.ints[j]))
				}
			}
		}
		if dst, err = appendRun(dst, run); err != nil {
			return nil, err
		}
	}
	// The channel groups of the whole direct rows (mode 2's runs), then the edge parts.
	pos, seg := groupLayout(grp, ng, nw)
	grouped := make([]uint32, nw*rowLen)
	w := 0
	for _, p := range parts {
		if p.kind == partDirect && p.hi-p.lo == rowLen {
			for i, v := range p.ints {
				grouped[pos[i]+w] = zigzag(v)
			}
			w++
		}
	}
	off := 0
	for _, r := range seg {
		if dst, err = appendRun(dst, grouped[off:off+r]); err != nil {
			return nil, err
		}
		off += r
	}
	return appendRun(dst, edge)
}

// appendRun writes one run of mode 4: u8 width (0 when every code is 0, or the run is empty),
// then a plane table of width planes.
func appendRun(dst []byte, zz []uint32) ([]byte, error) {
	var mx uint32
	for _, z := range zz {
		mx = max(mx, z)
	}
	width := 0
	for mx>>(8*width) != 0 {
		width++
	}
	dst = append(dst, byte(width))
	if width == 0 {
		return dst, nil
	}
	planes := make([][]byte, width)
	for j := range width {
		planes[j] = make([]byte, len(zz))
		for i, z := range zz {
			planes[j][i] = byte(z >> (8 * j))
		}
	}
	return appendPlanes(dst, planes, 0)
}

// readRun reads one run of mode 4 of r integers into out (zigzag decoded).
func readRun(p []byte, out []float64) ([]byte, error) {
	if len(p) < 1 {
		return nil, fmt.Errorf("run width: %w", ErrCorrupt)
	}
	width := int(p[0])
	p = p[1:]
	r := len(out)
	if width > 3 || (r == 0 && width != 0) {
		return nil, fmt.Errorf("run of %d integers of width %d: %w", r, width, ErrCorrupt)
	}
	if width == 0 {
		clear(out)
		return p, nil
	}
	pl, rest, err := readPlanes(p, width, r)
	if err != nil {
		return nil, fmt.Errorf("integers: %w", err)
	}
	for i := range r {
		var z uint32
		for j := range width {
			z |= uint32(pl[j*r+i]) << (8 * j)
		}
		out[i] = float64(int32(z>>1) ^ -int32(z&1))
	}
	return rest, nil
}

// decodeSharedBlock decodes a mode-4 block on sb.
func decodeSharedBlock(dst, src []byte, dt dtype.DType, rawLen int, sb *SharedBasis) ([]byte, error) {
	if rawLen < 0 || rawLen > MaxBlockSize {
		return nil, fmt.Errorf("block of %d bytes: %w", rawLen, ErrCorrupt)
	}
	w := dt.Size()
	if !fp8Able(dt) || rawLen%w != 0 || rawLen == 0 {
		return nil, fmt.Errorf("transform block of %s, %d bytes: %w", dt, rawLen, ErrCorrupt)
	}
	if len(src) < sharedHeader {
		return nil, fmt.Errorf("short header: %w", ErrCorrupt)
	}
	n := rawLen / w
	rowLen := int(binary.LittleEndian.Uint32(src[1:]))
	first := int(binary.LittleEndian.Uint32(src[5:]))
	k := int(binary.LittleEndian.Uint16(src[9:]))
	ng := int(src[11])
	crc := binary.LittleEndian.Uint32(src[12:])
	if sb == nil || sb.crc != crc {
		have := "none"
		if sb != nil {
			have = fmt.Sprintf("%08x", sb.crc)
		}
		return nil, fmt.Errorf("block coded on basis packet crc32 %08x, given %s: %w", crc, have, ErrNeedBasis)
	}
	tb := &sb.tb
	if rowLen != tb.d || k > tb.k || first < 1 || first > rowLen || first > n {
		return nil, fmt.Errorf("rows of %d (basis %d), k %d of %d, first part %d of %d values: %w", rowLen, tb.d, k, tb.k, first, n, ErrCorrupt)
	}
	if ng < 1 || ng > maxGroups || (ng > 1 && rowLen < ng) {
		return nil, fmt.Errorf("%d channel groups for rows of %d: %w", ng, rowLen, ErrCorrupt)
	}
	groups := 1 + (n-first+rowLen-1)/rowLen
	p := src[sharedHeader:]
	grp := make([]uint8, rowLen)
	if ng > 1 {
		mapLen := (rowLen + 1) / 2
		if len(p) < mapLen {
			return nil, fmt.Errorf("channel groups: %w", ErrCorrupt)
		}
		for i := range grp {
			grp[i] = p[i/2] >> (4 * (i & 1)) & 15
			if int(grp[i]) >= ng {
				return nil, fmt.Errorf("channel %d in group %d of %d: %w", i, grp[i], ng, ErrCorrupt)
			}
		}
		if rowLen%2 == 1 && p[mapLen-1]>>4 != 0 {
			return nil, fmt.Errorf("channel group padding: %w", ErrCorrupt)
		}
		p = p[mapLen:]
	}
	pl, p, err := readPlanes(p, 5, groups)
	if err != nil {
		return nil, fmt.Errorf("row parts: %w", err)
	}
	kinds := pl[:groups]
	steps := make([]float64, groups)
	var nb, nw int
	var edgeLen int
	for g := range groups {
		lo, hi := partBounds(g, first, rowLen, n)
		b := uint32(pl[groups+g]) | uint32(pl[2*groups+g])<<8 | uint32(pl[3*groups+g])<<16 | uint32(pl[4*groups+g])<<24
		s := math.Float32frombits(b)
		steps[g] = float64(s)
		switch kinds[g] {
		case partBasis, partDirect:
			if !(s > 0) || math.IsInf(float64(s), 0) {
				return nil, fmt.Errorf("row part %d: step %g: %w", g, s, ErrCorrupt)
			}
			switch {
			case kinds[g] == partBasis && hi-lo != rowLen:
				return nil, fmt.Errorf("row part %d: basis part of %d values: %w", g, hi-lo, ErrCorrupt)
			case kinds[g] == partBasis:
				nb++
			case hi-lo == rowLen:
				nw++
			default:
				edgeLen += hi - lo
			}
		case partZero:
			if b != 0 {
				return nil, fmt.Errorf("row part %d: zero part with step %g: %w", g, s, ErrCorrupt)
			}
		default:
			return nil, fmt.Errorf("row part %d: kind %d: %w", g, kinds[g], ErrCorrupt)
		}
	}
	coefs := make([]float64, nb*k) // component-major
	for b0 := 0; b0 < k; b0 += sharedBand {
		if p, err = readRun(p, coefs[b0*nb:min(k, b0+sharedBand)*nb]); err != nil {
			return nil, err
		}
	}
	pos, seg := groupLayout(grp, ng, nw)
	grouped := make([]float64, nw*rowLen)
	off := 0
	for _, r := range seg {
		if p, err = readRun(p, grouped[off:off+r]); err != nil {
			return nil, err
		}
		off += r
	}
	edge := make([]float64, edgeLen)
	if p, err = readRun(p, edge); err != nil {
		return nil, err
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%d trailing bytes: %w", len(p), ErrCorrupt)
	}
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start:]
	put := func(i int, f float32) {
		switch dt {
		case dtype.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case dtype.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToBFloat16(f))
		default:
			binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToFloat16(f))
		}
	}
	acc := make([]float64, rowLen)
	bf := make([]float64, k*rowLen) // the basis as float64 integers
	for i := range bf {
		bf[i] = float64(tb.b[i])
	}
	br, wr := 0, 0
	for g := range groups {
		lo, hi := partBounds(g, first, rowLen, n)
		switch kinds[g] {
		case partZero:
			for i := lo; i < hi; i++ {
				put(i, 0)
			}
		case partDirect:
			q := steps[g]
			if hi-lo == rowLen {
				for c := range rowLen {
					put(lo+c, float32(q*grouped[pos[c]+wr]))
				}
				wr++
				continue
			}
			for i := lo; i < hi; i++ {
				put(i, float32(q*edge[0]))
				edge = edge[1:]
			}
		case partBasis:
			clear(acc)
			for j := range k {
				if c := coefs[j*nb+br]; c != 0 {
					axpy(acc, c, bf[j*rowLen:(j+1)*rowLen])
				}
			}
			qs := math.Ldexp(steps[g], -tb.shift)
			for i := range rowLen {
				put(lo+i, float32(float64(tb.mean[i])+float64(qs*acc[i]))) // no fused multiply-add
			}
			br++
		}
	}
	return dst, nil
}
