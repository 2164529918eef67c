package codec

import (
	"bytes"
	"errors"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/huff0"

	"github.com/strap-llm/strap/internal/dtype"
)

// smallCorpus is chunks of 17 bytes to smallMax-1 of the kinds the shuffle codec meets:
// float planes (with and without zeros), k equally likely values, geometric values with
// long tails (codes longer than huff0's limit, so setMaxHeight runs), one repeated byte,
// all-distinct bytes, and the planes of real one-token decode records.
func smallCorpus(t *testing.T) [][]byte {
	return huffCorpus(t, []int{17, 24, 64, 100, 128, 255, 256, 512, 1000, 1023, 1024, 1500, 2048, smallMax - 1})
}

// largeCorpus is smallCorpus's kinds of chunk from smallMax to a zstd block (128 KiB), the
// planes of prefill blocks.
func largeCorpus(t *testing.T) [][]byte {
	return huffCorpus(t, []int{smallMax, smallMax + 1, sampleMin - 1, sampleMin, 16 << 10, 40000, 64 << 10, literalsChunk - 3, literalsChunk})
}

// huffCorpus is the chunks of smallCorpus at the sizes given.
func huffCorpus(t *testing.T, sizes []int) [][]byte {
	r := rand.New(rand.NewPCG(38, 2))
	var corpus [][]byte
	for _, n := range sizes {
		for rep := range 6 {
			planes := make([]byte, 4*n)
			shuffle(planes, normalF32(n, 0.1*float64(rep%3), uint64(1000*n+rep)), 4, true)
			for j := range 4 {
				corpus = append(corpus, planes[j*n:(j+1)*n])
			}
			for _, k := range []int{2, 3, 16, 64, 200, 256} {
				u, g := make([]byte, n), make([]byte, n)
				for i := range n {
					u[i] = byte(r.IntN(k))
					g[i] = byte(min(255, int(r.ExpFloat64()*float64(k)/4)))
				}
				corpus = append(corpus, u, g)
			}
			// Counts halving from symbol to symbol: the unlimited tree is as deep as
			// there are symbols.
			f := make([]byte, 0, n)
			for s := 0; len(f) < n; s++ {
				for range max(1, n>>(s+1)) {
					f = append(f, byte(s*7+rep))
				}
			}
			corpus = append(corpus, f[:n], bytes.Repeat([]byte{byte(rep)}, n))
			d := make([]byte, n)
			for i := range d {
				d[i] = byte(i * (2*rep + 1))
			}
			corpus = append(corpus, d)
		}
	}
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		for _, rec := range decodeRecords(t, dt) {
			w := dt.Size()
			planes := make([]byte, len(rec))
			shuffle(planes, rec, w, true)
			for j := range w {
				corpus = append(corpus, planes[j*len(rec)/w:(j+1)*len(rec)/w])
			}
		}
	}
	return corpus
}

// TestSmallHuffmanMatchesHuff0: the small-chunk Huffman coder writes the bytes huff0 writes
// (table, jump table, streams) and refuses what huff0 refuses, so stored blocks are the
// same as before it (goldens, resume and every reader unaffected) and only the CPU differs.
func TestSmallHuffmanMatchesHuff0(t *testing.T) {
	testHuffmanMatchesHuff0(t, smallCorpus(t))
}

// TestLargeHuffmanMatchesHuff0 is TestSmallHuffmanMatchesHuff0 for the chunks of prefill
// blocks (smallMax to 128 KiB), counted by countLarge as the plane encoder does.
func TestLargeHuffmanMatchesHuff0(t *testing.T) {
	corpus := largeCorpus(t)
	// Prefill planes of real activations: the decode records end to end, repeated.
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		var real []byte
		for _, r := range decodeRecords(t, dt) {
			real = append(real, r...)
		}
		for _, size := range []int{16 << 10, 256 << 10} {
			src := bytes.Repeat(real, size/len(real)+1)[:size]
			w := dt.Size()
			planes := make([]byte, size)
			shuffle(planes, src, w, true)
			for j := range w {
				p := planes[j*size/w : (j+1)*size/w]
				corpus = append(corpus, p[:min(len(p), literalsChunk)])
			}
		}
	}
	testHuffmanMatchesHuff0(t, corpus)
}

// huff0Literals is huff0's coding of a literals chunk as zstd's encoder picks it: one stream
// under 1 KiB, four from 1 KiB.
func huff0Literals(c []byte) ([]byte, error) {
	compress := huff0.Compress1X
	if len(c) >= 1024 {
		compress = huff0.Compress4X
	}
	out, _, err := compress(c, &huff0.Scratch{})
	return out, err
}

func testHuffmanMatchesHuff0(t *testing.T, corpus [][]byte) {
	var sh smallHuff
	limited, coded := 0, 0
	for i, c := range corpus {
		want, wantErr := huff0Literals(c)
		h := countFor(&sh, c)
		got, err := sh.smallHuffman(c, h)
		switch {
		case wantErr != nil:
			if !errors.Is(err, wantErr) {
				t.Errorf("chunk %d (%d bytes): error %v, huff0 %v", i, len(c), err, wantErr)
			}
		case err != nil:
			t.Errorf("chunk %d (%d bytes): error %v, huff0 wrote %d bytes", i, len(c), err, len(want))
		case !bytes.Equal(got, want):
			t.Errorf("chunk %d (%d bytes): %d bytes differ from huff0's %d", i, len(c), len(got), len(want))
		default:
			coded++
			if deepest(c) > int(optimalTableLog(len(c), topSymbol(h)+1)) {
				limited++
			}
		}
	}
	if coded == 0 || limited == 0 {
		t.Errorf("%d chunks coded, %d of them with lengths limited: the corpus misses a case", coded, limited)
	}
	t.Logf("%d chunks coded as huff0 does, %d with lengths limited", coded, limited)
}

// countFor counts c as the plane encoder does: chunkCounts under smallMax, countLarge from it.
func countFor(sh *smallHuff, c []byte) *[256]uint32 {
	if len(c) < smallMax {
		sh.counts.count(c)
	} else {
		sh.countLarge(c)
	}
	return &sh.counts.h
}

func topSymbol(h *[256]uint32) int {
	top := 255
	for h[top] == 0 {
		top--
	}
	return top
}

// deepest is the longest code of an unlimited Huffman tree over c's byte counts.
func deepest(c []byte) int {
	var sh smallHuff
	sh.counts.count(c)
	h := &sh.counts.h
	k := 0
	leaves := sh.nodes[1:]
	for s, v := range h {
		if v == 0 {
			continue
		}
		pos := k
		for pos > 0 && v > leaves[pos-1].count {
			leaves[pos] = leaves[pos-1]
			pos--
		}
		leaves[pos] = huffNode{count: v, symbol: byte(s)}
		k++
	}
	if k < 2 {
		return 0
	}
	sh.buildTree(k)
	return int(leaves[k-1].nbBits)
}

// countsLookUniformBefore is countsLookUniform as issue 38's second pass wrote it (a
// branch and a counter in memory per symbol): the judgement must not change, only its cost.
func countsLookUniformBefore(chunk []byte) bool {
	var h [256]uint32
	for _, b := range chunk {
		h[b]++
	}
	n := len(chunk)
	var sum int64
	var class [14]uint16
	top, k := 0, 0
	for s, v := range h {
		if v > 0 {
			sum += cLog2C[v]
			class[bits.Len32(v)]++
			top = s
			k++
		}
	}
	m := top + 1
	wsum := cLog2C[m-k]
	for c := 1; c < len(class); c++ {
		wsum += cLog2C[class[c]]
	}
	data := cLog2C[n] - sum
	table := cLog2C[m] - wsum
	return 100*(data+table+24<<fracBits) >= 99*8*int64(n)<<fracBits
}

func TestCountsLookUniformUnchanged(t *testing.T) {
	for i, c := range smallCorpus(t) {
		if got, want := smallLooksUniform(c), countsLookUniformBefore(c); got != want {
			t.Errorf("chunk %d (%d bytes): uniform %v, before %v", i, len(c), got, want)
		}
	}
}

// TestShuffleDecodeRecordAllocs: encoding a decode record allocates nothing (the Huffman
// working memory is pooled).
func TestShuffleDecodeRecordAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector (its sync.Pool drops items); run without -race (make test-arm64 does)")
	}
	c, err := New("shuffle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := decodeRecords(t, dtype.Float32)
	dst := make([]byte, 0, 4096)
	c.Encode(dst[:0], recs[0], dtype.Float32) // warm the pools
	if a := testing.AllocsPerRun(100, func() {
		for _, r := range recs {
			if _, _, err := c.Encode(dst[:0], r, dtype.Float32); err != nil {
				t.Fatal(err)
			}
		}
	}); a > 0 {
		t.Errorf("%.1f allocations per 24 records, want 0", a)
	}
}

// FuzzSmallHuffmanMatchesHuff0 is TestSmallHuffmanMatchesHuff0 over any chunk: the same
// bytes as huff0 or the same refusal, and the frame decodes (klauspost's zstd decoder) to
// the chunk.
func FuzzSmallHuffmanMatchesHuff0(f *testing.F) {
	f.Add(bytes.Repeat([]byte{1, 2, 3, 1, 1, 2, 1, 1, 9}, 7), uint16(0))
	f.Add(normalF32(300, 0, 1), uint16(1))
	f.Add(bytes.Repeat([]byte{7, 7, 7, 1, 200, 7, 3}, 700), uint16(7))
	f.Add(normalF32(1200, 0, 2), uint16(20))
	f.Fuzz(func(t *testing.T, c []byte, rep uint16) {
		// rep > 1 repeats the chunk (each copy with its bytes moved by the copy's index, so
		// the counts are not simply scaled) up to a zstd block, for the planes of prefill
		// blocks that countLarge counts.
		if rep > 1 && len(c) > 0 {
			r := int(rep) % 128
			big := make([]byte, 0, min(literalsChunk, len(c)*r))
			for i := 0; i < r && len(big) < literalsChunk; i++ {
				for _, b := range c[:min(len(c), literalsChunk-len(big))] {
					big = append(big, b+byte(i&3))
				}
			}
			c = big
		}
		if len(c) <= 16 || len(c) > literalsChunk {
			return
		}
		want, wantErr := huff0Literals(c)
		var sh smallHuff
		got, err := sh.smallHuffman(c, countFor(&sh, c))
		if (err == nil) != (wantErr == nil) || (err != nil && !errors.Is(err, wantErr)) {
			t.Fatalf("error %v, huff0 %v", err, wantErr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("%d bytes differ from huff0's %d", len(got), len(want))
		}
		frame, err := appendPlane(nil, c, 0)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, len(c))
		if err := decodePlane(out, frame); err != nil || !bytes.Equal(out, c) {
			t.Fatalf("plane frame does not decode to the chunk: %v", err)
		}
	})
}

// TestShufflePrefillAllocs: prefill blocks (a 16 KiB row to a 1 MiB block, fp32 and bf16)
// encode with no allocation once the pools are warm; the large-plane coder's scratch is
// pooled with the small one's.
func TestShufflePrefillAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector (its sync.Pool drops items); run without -race (make test-arm64 does)")
	}
	c, err := New("shuffle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
		var real []byte
		for _, r := range decodeRecords(t, dt) {
			real = append(real, r...)
		}
		for _, size := range []int{16 << 10, 256 << 10, 1 << 20} {
			src := bytes.Repeat(real, size/len(real)+1)[:size]
			dst := make([]byte, 0, size+size/8)
			c.Encode(dst[:0], src, dt) // warm the pools
			if a := testing.AllocsPerRun(5, func() {
				if _, _, err := c.Encode(dst[:0], src, dt); err != nil {
					t.Fatal(err)
				}
			}); a > 0 {
				t.Errorf("%s %d KiB: %.1f allocations per block, want 0", dt, size>>10, a)
			}
		}
	}
}
