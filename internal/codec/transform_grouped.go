package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// Mode 2 of transform (COMPRESSION.md 5.2): the same integers as mode 0, entropy-coded with
// a Huffman table per group of channels. In mode 0 every directly coded value of a block
// shares one table, so a channel that stays near zero pays for the spread of the outlier
// channels beside it; here the whole directly coded rows are stored channel by channel,
// channels of like spread in one group, each group its own plane frames. The per-row kinds
// and steps move into plane frames too (their exponent bytes repeat from row to row). The
// decoded values are those of mode 0 bit for bit: only where the integers are stored changes.

const (
	// modeGrouped is the mode byte of a transform block with channel-grouped integers.
	modeGrouped = 2
	// maxGroups is the most channel groups (a group number fits a nibble).
	maxGroups = 16
	// minGroupRows: blocks with fewer whole directly coded rows use one group (G tables of a
	// few hundred values each would cost more than they save).
	minGroupRows = 32
	// minGroupedParts: blocks of fewer row parts are written in mode 0 (the five plane
	// frames of mode 2's kinds and steps cost more than the 5 bytes a part they replace;
	// one-token decode records are one part).
	minGroupedParts = 32
)

// transformGroups is how many channel groups the encoder makes where it may.
var transformGroups = 8

// chooseGroups assigns each channel of a row to a group by the mean magnitude of its
// integers over the whole directly coded rows, in equal shares (ties by channel index): a
// function of the integers alone, so of the block.
func chooseGroups(parts []tPart, rowLen int) (int, []uint8) {
	grp := make([]uint8, rowLen)
	nw := 0
	for _, p := range parts {
		if p.kind == partDirect && p.hi-p.lo == rowLen {
			nw++
		}
	}
	ng := min(transformGroups, maxGroups)
	if nw < minGroupRows || rowLen < 4*ng || ng < 2 {
		return 1, grp
	}
	sum := make([]int64, rowLen)
	for _, p := range parts {
		if p.kind == partDirect && p.hi-p.lo == rowLen {
			for i, v := range p.ints {
				if v < 0 {
					v = -v
				}
				sum[i] += int64(v)
			}
		}
	}
	order := make([]int, rowLen)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return sum[order[a]] < sum[order[b]] })
	for r, i := range order {
		grp[i] = uint8(r * ng / rowLen)
	}
	return ng, grp
}

// groupLayout is where mode 2 stores the integers of the whole directly coded rows: pos[i]
// is channel i's first integer in the grouped run (then one per whole row), seg the run's
// length per group.
func groupLayout(grp []uint8, ng, nw int) (pos, seg []int) {
	cnt := make([]int, ng)
	for _, g := range grp {
		cnt[g]++
	}
	start := make([]int, ng)
	for g := 1; g < ng; g++ {
		start[g] = start[g-1] + cnt[g-1]*nw
	}
	pos = make([]int, len(grp))
	for i, g := range grp {
		pos[i] = start[g]
		start[g] += nw
	}
	seg = make([]int, ng)
	for g := range ng {
		seg[g] = cnt[g] * nw
	}
	return pos, seg
}

// appendTransformGrouped writes a mode-2 block (COMPRESSION.md 5.2).
func appendTransformGrouped(dst []byte, parts []tPart, tb *tBasis, rowLen, first int) ([]byte, error) {
	k, shift := 0, 0
	if tb != nil {
		k, shift = tb.k, tb.shift
	}
	ng, grp := chooseGroups(parts, rowLen)
	var nb, nw, ne int
	for _, p := range parts {
		switch {
		case p.kind == partBasis:
			nb++
		case p.kind == partDirect && p.hi-p.lo == rowLen:
			nw++
		case p.kind == partDirect:
			ne += p.hi - p.lo
		}
	}
	pos, seg := groupLayout(grp, ng, nw)
	nc := nb * k
	m := nc + nw*rowLen + ne
	zz := make([]uint32, m)
	if k > 0 {
		i := 0
		for j := range k {
			for _, p := range parts {
				if p.kind == partBasis {
					zz[i] = zigzag(p.ints[j])
					i++
				}
			}
		}
	}
	w, e := 0, nc+nw*rowLen
	for _, p := range parts {
		if p.kind != partDirect {
			continue
		}
		if p.hi-p.lo == rowLen {
			for i, v := range p.ints {
				zz[nc+pos[i]+w] = zigzag(v)
			}
			w++
			continue
		}
		for _, v := range p.ints {
			zz[e] = zigzag(v)
			e++
		}
	}
	width := codeWidth(zz, m)
	dst = append(dst, modeGrouped)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(rowLen))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(first))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(k))
	dst = append(dst, byte(shift), byte(width), byte(ng))
	if k > 0 {
		for _, f := range tb.mean {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
		}
	}
	dst, err := appendGroupsAndParts(dst, grp, ng, rowLen, parts)
	if err != nil {
		return nil, err
	}
	if k > 0 {
		if dst, err = appendBasis(dst, tb.b[:k*rowLen]); err != nil {
			return nil, err
		}
	}
	// The runs: coefficients, each group's channels, the parts cut by the block's edges;
	// each non-empty run its own plane table of `width` planes.
	runs := append(append([]int{nc}, seg...), ne)
	off := 0
	for _, r := range runs {
		if r == 0 {
			continue
		}
		planes := make([][]byte, width)
		for j := range width {
			planes[j] = make([]byte, r)
			for i, z := range zz[off : off+r] {
				planes[j][i] = byte(z >> (8 * j))
			}
		}
		if dst, err = appendPlanes(dst, planes, 0); err != nil {
			return nil, err
		}
		off += r
	}
	return dst, nil
}

// readGroupedInts reads mode 2's integer runs and returns the integers in mode 0's order
// (coefficients, then the direct parts' values in part order) and the bytes after them.
func readGroupedInts(p []byte, kinds []byte, grp []uint8, ng, nc, m, width, first, rowLen, n int) ([]float64, []byte, error) {
	// dst[i] is where the i-th stored integer goes in mode 0's order.
	var whole, edge []int // offsets in mode 0's order of the whole and the edge direct parts
	o := nc
	for g, kd := range kinds {
		if kd != partDirect {
			continue
		}
		lo, hi := partBounds(g, first, rowLen, n)
		if hi-lo == rowLen {
			whole = append(whole, o)
		} else {
			for i := range hi - lo {
				edge = append(edge, o+i)
			}
		}
		o += hi - lo
	}
	if o != m {
		return nil, nil, fmt.Errorf("%d integers in parts, want %d: %w", o, m, ErrCorrupt)
	}
	ints := make([]float64, m)
	// run decodes the next run of r integers into tmp.
	var tmp []float64
	run := func(r int) error {
		tmp = tmp[:0]
		if r == 0 {
			return nil
		}
		pl, rest, err := readPlanes(p, width, r)
		if err != nil {
			return fmt.Errorf("integers: %w", err)
		}
		p = rest
		if cap(tmp) < r {
			tmp = make([]float64, r)
		}
		tmp = tmp[:r]
		if width == 1 {
			for i, z := range pl[:r] {
				tmp[i] = float64(int32(z>>1) ^ -int32(z&1))
			}
			return nil
		}
		for i := range r {
			var z uint32
			for j := range width {
				z |= uint32(pl[j*r+i]) << (8 * j)
			}
			tmp[i] = float64(int32(z>>1) ^ -int32(z&1))
		}
		return nil
	}
	if err := run(nc); err != nil {
		return nil, nil, err
	}
	copy(ints, tmp)
	nw := len(whole)
	if nw > 0 {
		// The groups' runs back to back: channel i's values over the whole rows start at
		// pos[i]. Then one pass row by row: sequential writes, and the reads of the next
		// rows share a cache line per channel (64 rows a line where the codes are bytes).
		pos, seg := groupLayout(grp, ng, nw)
		if width == 1 { // the common case: the codes moved as bytes, decoded in place
			gb := make([]byte, 0, nw*rowLen)
			for _, r := range seg {
				if r == 0 {
					continue
				}
				pl, rest, err := readPlanes(p, 1, r)
				if err != nil {
					return nil, nil, fmt.Errorf("integers: %w", err)
				}
				p = rest
				gb = append(gb, pl...)
			}
			for w, o := range whole {
				row := ints[o : o+rowLen]
				for c := range row {
					z := gb[pos[c]+w]
					row[c] = float64(int32(z>>1) ^ -int32(z&1))
				}
			}
		} else {
			grouped := make([]float64, 0, nw*rowLen)
			for _, r := range seg {
				if err := run(r); err != nil {
					return nil, nil, err
				}
				grouped = append(grouped, tmp...)
			}
			for w, o := range whole {
				row := ints[o : o+rowLen]
				for c := range row {
					row[c] = grouped[pos[c]+w]
				}
			}
		}
	}
	if err := run(len(edge)); err != nil {
		return nil, nil, err
	}
	for i, o := range edge {
		ints[o] = tmp[i]
	}
	return ints, p, nil
}

// appendGroupsAndParts appends what modes 2 and 4 store alike before their bands: each
// channel's group as a nibble (only with more than one group), then every row part's kind
// and its float32 step as five entropy-coded planes.
func appendGroupsAndParts(dst []byte, grp []uint8, ng, rowLen int, parts []tPart) ([]byte, error) {
	if ng > 1 {
		nib := make([]byte, (rowLen+1)/2)
		for i, g := range grp {
			nib[i/2] |= g << (4 * (i & 1))
		}
		dst = append(dst, nib...)
	}
	np := len(parts)
	ks := make([]byte, 5*np)
	for g, p := range parts {
		ks[g] = p.kind
		b := math.Float32bits(p.step)
		for j := range 4 {
			ks[(1+j)*np+g] = byte(b >> (8 * j))
		}
	}
	return appendPlanes(dst, [][]byte{ks[:np], ks[np : 2*np], ks[2*np : 3*np], ks[3*np : 4*np], ks[4*np:]}, 0)
}
