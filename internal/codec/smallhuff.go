package codec

// Huffman literals for the plane chunks of level 0, built from a histogram the caller took.
// Small chunks (17 bytes to smallMax: one-token decode records) use the count that
// smallLooksUniform judged them by; huff0 counted the chunk again and sorted and cleared
// tables sized for every symbol up to the largest: ≈ 5 µs of a 512-byte exponent plane's ≈ 6
// in a warm benchmark (issue 38). Larger chunks (smallMax to a 128 KiB zstd block: the planes
// of prefill blocks) are counted by countLarge, faster than huff0's single-histogram count on
// exponent planes, and huff0 itself is no longer called at level 0. The steps below are
// huff0's own (klauspost/compress v1.20.4, huff0/compress.go: huffSort, buildCTable,
// setMaxHeight, cTable.write, compress1xDo, compress4X; BSD-3-Clause, Copyright (c) 2019
// Klaus Post), restated over the symbols present only, so that the code lengths, the table
// header and the streams are the bytes huff0 writes: TestSmallHuffmanMatchesHuff0,
// TestLargeHuffmanMatchesHuff0 and the fuzz target hold them to it (and would catch a
// klauspost/compress upgrade that changes huff0's choices).
//
// The restated steps are a work derived from klauspost/compress, whose licence asks that its
// notice travel with them:
//
// Copyright (c) 2012 The Go Authors. All rights reserved.
// Copyright (c) 2019 Klaus Post. All rights reserved.
//
// Redistribution and use in source and binary forms, with or without modification, are
// permitted provided that the following conditions are met:
//
//   - Redistributions of source code must retain the above copyright notice, this list of
//     conditions and the following disclaimer.
//   - Redistributions in binary form must reproduce the above copyright notice, this list of
//     conditions and the following disclaimer in the documentation and/or other materials
//     provided with the distribution.
//   - Neither the name of Google Inc. nor the names of its contributors may be used to endorse
//     or promote products derived from this software without specific prior written
//     permission.
//
// THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS
// OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF
// MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE
// COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
// EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF
// SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION)
// HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR
// TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS
// SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"sync"

	"github.com/klauspost/compress/fse"
	"github.com/klauspost/compress/huff0"
)

const (
	huffTableLogMax = 11 // zstd's longest Huffman code, and huff0's default TableLog
	huffMinTableLog = 5
)

// huffNode is one node of the Huffman tree: a leaf (a present symbol, sorted by count) or
// an internal node.
type huffNode struct {
	count  uint32
	parent int16
	symbol byte
	nbBits uint8
}

// huffCode is a symbol's code: its value and length in bits (0: absent).
type huffCode struct {
	val    uint16
	nbBits uint8
}

// smallHuff is the working memory of smallHuffman, pooled with the plane encoder's.
type smallHuff struct {
	counts chunkCounts
	lanes  [4][256]uint32 // countLarge's four histograms
	// nodes[0] is the barrier huff0 reads at index -1; the tree starts at nodes[1].
	nodes   [2*256 + 2]huffNode
	codes   [256]huffCode
	present [256]byte // the symbols present, in symbol order
	radix   [256]huffNode
	weights [256]byte
	fse     fse.Scratch
	out     []byte
}

var smallHuffPool = sync.Pool{New: func() any { return new(smallHuff) }}

// smallHuffman returns the Huffman-compressed literals of chunk (table description, then one
// stream under 1 KiB or four from 1 KiB, as huff0.Compress1X / Compress4X), given its byte
// histogram h. The errors are huff0's: ErrUseRLE for one repeated byte, ErrIncompressible
// where huff0 refuses. The result lives in s until its next use.
func (s *smallHuff) smallHuffman(chunk []byte, h *[256]uint32) ([]byte, error) {
	n := len(chunk)
	var (
		maxCount uint32
		top      int // the largest symbol present
		k        int // symbols present
	)
	// The symbols present, in symbol order, and the largest count, without a branch on
	// the counts.
	present := &s.present
	for sym, c := range h {
		present[k] = byte(sym)
		if c != 0 {
			k++
		}
		maxCount = max(maxCount, c)
	}
	if k > 0 {
		top = int(present[k-1])
	}
	// huff0's refusals come before its sort, so noise costs no sort here either.
	switch {
	case int(maxCount) == n:
		return nil, huff0.ErrUseRLE
	case maxCount == 1 || int(maxCount) < n>>7:
		return nil, huff0.ErrIncompressible
	}
	s.sortLeaves(h, k, n)
	leaves := s.nodes[1:]
	symbolLen := top + 1
	maxNbBits := optimalTableLog(n, symbolLen)
	s.buildTree(k)
	maxNbBits = s.setMaxHeight(k-1, maxNbBits)
	if maxNbBits > huffTableLogMax {
		return nil, huff0.ErrIncompressible
	}
	// Canonical values: per length, a starting value; within a length, symbol order.
	var nbPerRank [huffTableLogMax + 1]uint16
	var valPerRank [16]uint16
	for _, l := range leaves[:k] {
		nbPerRank[l.nbBits]++
	}
	lo := uint16(0)
	for b := maxNbBits; b > 0; b-- {
		valPerRank[b] = lo
		lo += nbPerRank[b]
		lo >>= 1
	}
	codes := s.codes[:symbolLen]
	clear(codes)
	for _, l := range leaves[:k] {
		codes[l.symbol].nbBits = l.nbBits
	}
	for _, sym := range present[:k] {
		b := codes[sym].nbBits & 15
		codes[sym].val = valPerRank[b]
		valPerRank[b]++
	}
	out, err := s.writeTable(s.out[:0], symbolLen, maxNbBits)
	if err != nil {
		return nil, err
	}
	if n < 1024 {
		out = s.stream(out, chunk)
	} else {
		seg := (n + 3) / 4
		jt := len(out)
		out = append(out, 0, 0, 0, 0, 0, 0)
		for i := range 4 {
			part := chunk[min(n, i*seg):min(n, (i+1)*seg)]
			start := len(out)
			out = s.stream(out, part)
			if len(out)-start > math.MaxUint16 {
				// huff0's limit: the jump table holds 16-bit stream sizes.
				return nil, huff0.ErrIncompressible
			}
			if i < 3 {
				binary.LittleEndian.PutUint16(out[jt+2*i:], uint16(len(out)-start))
			}
		}
	}
	s.out = out
	if len(out) >= n {
		return nil, huff0.ErrIncompressible
	}
	return out, nil
}

// sortLeaves puts the k present symbols (s.present) of a chunk of n bytes in the leaves
// sorted by count, descending, ties in symbol order: huffSort's order, by any stable sort.
// A few symbols (an exponent plane's) are insertion-sorted; many (a plane of mantissa bits
// that was not judged uniform: fp16's, or a chunk of small integers) by a stable radix sort
// on the count (under smallMax, two passes of 6 bits; up to a zstd block of 128 KiB, three),
// where insertion (huff0's, within buckets of counts of one bit length) is quadratic on
// near-flat counts.
func (s *smallHuff) sortLeaves(h *[256]uint32, k, n int) {
	leaves := s.nodes[1:]
	if k <= 32 {
		for i, sym := range s.present[:k] {
			c := h[sym]
			pos := i
			for pos > 0 && c > leaves[pos-1].count {
				leaves[pos] = leaves[pos-1]
				pos--
			}
			leaves[pos] = huffNode{count: c, symbol: sym}
		}
		return
	}
	// Keys ascend as counts descend; the passes keep the symbol order of equal keys.
	tmp := &s.radix
	for i, sym := range s.present[:k] {
		tmp[i] = huffNode{count: h[sym], symbol: sym}
	}
	passes := 2
	if n >= smallMax {
		passes = 3
	}
	top := uint32(1)<<(6*passes) - 1 // over every count of n bytes
	key := func(c uint32, shift uint) uint32 { return (top - c) >> shift & 63 }
	for pass := range passes {
		shift := uint(6 * pass)
		from, to := tmp[:k], leaves[:k]
		if pass&1 == 1 {
			from, to = leaves[:k], tmp[:k]
		}
		var start [64]int
		for _, l := range from {
			start[key(l.count, shift)]++
		}
		sum := 0
		for i, c := range start {
			start[i] = sum
			sum += c
		}
		for _, l := range from {
			b := key(l.count, shift)
			to[start[b]] = l
			start[b]++
		}
	}
	if passes&1 == 0 {
		copy(leaves[:k], tmp[:k])
	}
}

// optimalTableLog is huff0's longest allowed code for n bytes whose largest symbol is
// symbolLen-1.
func optimalTableLog(n, symbolLen int) uint8 {
	tableLog := uint8(huffTableLogMax)
	minBits := uint8(min(bits.Len32(uint32(n)), bits.Len32(uint32(symbolLen-1))+1))
	if maxBitsSrc := uint8(bits.Len32(uint32(n-1))) - 2; maxBitsSrc < tableLog {
		tableLog = maxBitsSrc
	}
	tableLog = max(tableLog, minBits, huffMinTableLog)
	return min(tableLog, huffTableLogMax)
}

// buildTree gives each of the k sorted leaves its unlimited code length (huff0's two-queue
// build: leaves from the rarest up, internal nodes in the order they are made).
func (s *smallHuff) buildTree(k int) {
	node0 := s.nodes[:] // node0[i+1] is node i; node0[0] the barrier
	node := s.nodes[1:]
	nodeNb := int16(k)   // the first internal node
	lowS := int16(k - 1) // the rarest leaf
	nodeRoot := nodeNb + lowS - 1
	lowN := nodeNb
	node[nodeNb] = huffNode{count: node[lowS].count + node[lowS-1].count}
	node[lowS].parent = nodeNb
	node[lowS-1].parent = nodeNb
	nodeNb++
	lowS -= 2
	for i := nodeNb; i <= nodeRoot; i++ {
		node[i] = huffNode{count: 1 << 30}
	}
	node0[0].count = 1 << 31
	for nodeNb <= nodeRoot {
		var n1, n2 int16
		if node0[lowS+1].count < node0[lowN+1].count {
			n1, lowS = lowS, lowS-1
		} else {
			n1, lowN = lowN, lowN+1
		}
		if node0[lowS+1].count < node0[lowN+1].count {
			n2, lowS = lowS, lowS-1
		} else {
			n2, lowN = lowN, lowN+1
		}
		node[nodeNb].count = node0[n1+1].count + node0[n2+1].count
		node0[n1+1].parent = nodeNb
		node0[n2+1].parent = nodeNb
		nodeNb++
	}
	node[nodeRoot].nbBits = 0
	for i := nodeRoot - 1; i >= int16(k); i-- {
		node[i].nbBits = node[node[i].parent].nbBits + 1
	}
	for i := range k {
		node[i].nbBits = node[node[i].parent].nbBits + 1
	}
}

// setMaxHeight limits the code lengths of the leaves 0..lastNonNull to maxNbBits (huff0's
// setMaxHeight, kept line for line so the lengths are huff0's) and returns the longest.
func (s *smallHuff) setMaxHeight(lastNonNull int, maxNbBits uint8) uint8 {
	node := s.nodes[1:]
	largestBits := node[lastNonNull].nbBits
	if largestBits <= maxNbBits {
		return largestBits
	}
	totalCost := 0
	baseCost := 1 << (largestBits - maxNbBits)
	n := uint32(lastNonNull)
	for node[n].nbBits > maxNbBits {
		totalCost += baseCost - (1 << (largestBits - node[n].nbBits))
		node[n].nbBits = maxNbBits
		n--
	}
	for node[n].nbBits == maxNbBits {
		n--
	}
	totalCost >>= largestBits - maxNbBits

	const noSymbol = 0xF0F0F0F0
	var rankLast [huffTableLogMax + 2]uint32
	for i := range rankLast {
		rankLast[i] = noSymbol
	}
	cur := maxNbBits
	for pos := int(n); pos >= 0; pos-- {
		if node[pos].nbBits >= cur {
			continue
		}
		cur = node[pos].nbBits
		rankLast[maxNbBits-cur] = uint32(pos)
	}
	for totalCost > 0 {
		dec := uint8(bits.Len32(uint32(totalCost)))
		for ; dec > 1; dec-- {
			highPos, lowPos := rankLast[dec], rankLast[dec-1]
			if highPos == noSymbol {
				continue
			}
			if lowPos == noSymbol {
				break
			}
			if node[highPos].count <= 2*node[lowPos].count {
				break
			}
		}
		for dec <= huffTableLogMax && rankLast[dec] == noSymbol {
			dec++
		}
		totalCost -= 1 << (dec - 1)
		if rankLast[dec-1] == noSymbol {
			rankLast[dec-1] = rankLast[dec]
		}
		node[rankLast[dec]].nbBits++
		if rankLast[dec] == 0 {
			rankLast[dec] = noSymbol
		} else {
			rankLast[dec]--
			if node[rankLast[dec]].nbBits != maxNbBits-dec {
				rankLast[dec] = noSymbol
			}
		}
	}
	for totalCost < 0 {
		if rankLast[1] == noSymbol {
			for node[n].nbBits == maxNbBits {
				n--
			}
			node[n+1].nbBits--
			rankLast[1] = n + 1
			totalCost++
			continue
		}
		node[rankLast[1]+1].nbBits--
		rankLast[1]++
		totalCost++
	}
	return maxNbBits
}

// writeTable appends the Huffman tree description (the weights of symbols 0..symbolLen-2,
// FSE-coded, or 4 bits each when that is not shorter) as huff0's cTable.write does.
func (s *smallHuff) writeTable(dst []byte, symbolLen int, huffLog uint8) ([]byte, error) {
	maxSymbolValue := symbolLen - 1
	weights := s.weights[:256]
	hist := s.fse.Histogram()[:256]
	clear(hist[:16])
	for i, c := range s.codes[:maxSymbolValue] {
		var w byte
		if c.nbBits > 0 {
			w = (huffLog + 1 - c.nbBits) & 15
		}
		weights[i] = w
		hist[w]++
	}
	if maxSymbolValue >= 2 {
		var huffMaxCnt uint32
		var huffMax uint8
		for i, v := range hist[:16] {
			if v == 0 {
				continue
			}
			huffMax = byte(i)
			huffMaxCnt = max(huffMaxCnt, v)
		}
		s.fse.HistogramFinished(huffMax, int(huffMaxCnt))
		s.fse.TableLog = 6
		b, err := fse.Compress(weights[:maxSymbolValue], &s.fse)
		if err == nil && len(b) < symbolLen>>1 {
			dst = append(dst, byte(len(b)))
			return append(dst, b...), nil
		}
	}
	if maxSymbolValue > 128 {
		return nil, huff0.ErrIncompressible
	}
	dst = append(dst, byte(128|(maxSymbolValue-1)))
	weights[maxSymbolValue] = 0
	for i := 0; i < maxSymbolValue; i += 2 {
		dst = append(dst, weights[i]<<4|weights[i+1])
	}
	return dst, nil
}

// stream appends one Huffman stream of src: the codes from the last byte to the first,
// least significant bit first, then a 1 bit and zero padding to a byte (zstd reads it
// backwards). Four codes (at most 44 bits) join the at most 7 bits left after each store.
func (s *smallHuff) stream(dst, src []byte) []byte {
	codes := &s.codes
	pos := len(dst)
	dst = slices.Grow(dst, len(src)*huffTableLogMax/8+16)
	buf := dst[:cap(dst)]
	var c uint64
	var nb uint
	i := len(src)
	for i&3 != 0 {
		i--
		e := codes[src[i]]
		c |= uint64(e.val) << (nb & 63)
		nb += uint(e.nbBits)
	}
	for i >= 4 {
		i -= 4
		q := src[i : i+4]
		a, b, d, e := codes[q[3]], codes[q[2]], codes[q[1]], codes[q[0]]
		// The four codes are joined first, off the chain through c and nb.
		ab := uint(a.nbBits)
		abd := ab + uint(b.nbBits)
		abde := abd + uint(d.nbBits)
		four := uint64(a.val) | uint64(b.val)<<(ab&63) | uint64(d.val)<<(abd&63) | uint64(e.val)<<(abde&63)
		binary.LittleEndian.PutUint64(buf[pos:], c)
		pos += int(nb >> 3)
		c >>= (nb &^ 7) & 63
		nb &= 7
		c |= four << nb
		nb += abde + uint(e.nbBits)
	}
	c |= 1 << (nb & 63)
	nb++
	binary.LittleEndian.PutUint64(buf[pos:], c)
	return dst[:pos+int(nb+7)>>3]
}

// countLarge sets s.counts.h to the byte counts of chunk, a plane chunk of smallMax bytes or
// more (up to a zstd block). Four histograms take the bytes in turn: a plane of few values
// (an exponent plane) increments the same counter byte after byte, and with one histogram
// each increment waits for the previous one's store (huff0's countSimple: 31–41 % of the
// encoder's CPU on prefill blocks of real activations; countLarge takes about half its time).
func (s *smallHuff) countLarge(chunk []byte) {
	t := &s.lanes
	*t = [4][256]uint32{}
	for len(chunk) >= 8 {
		v := binary.LittleEndian.Uint64(chunk)
		t[0][byte(v)]++
		t[1][byte(v>>8)]++
		t[2][byte(v>>16)]++
		t[3][byte(v>>24)]++
		t[0][byte(v>>32)]++
		t[1][byte(v>>40)]++
		t[2][byte(v>>48)]++
		t[3][byte(v>>56)]++
		chunk = chunk[8:]
	}
	for _, b := range chunk {
		t[0][b]++
	}
	h := &s.counts.h
	for i := range h {
		h[i] = t[0][i] + t[1][i] + t[2][i] + t[3][i]
	}
}
