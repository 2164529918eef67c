// Command compression benchmarks every codec on activation corpora and prints the table of
// docs/COMPRESSION.md: ratio versus raw bytes, max-abs and relative-L2 error, and compress /
// decompress MB/s on one core, for each codec × corpus × dtype (float32, bfloat16, float16),
// then the per-row fidelity of the lossy codecs (rows: the tensors' last dimension).
//
//	.venv/bin/python bench/compression/gen_corpus.py --out /tmp/strap-corpus
//	go run ./bench/compression -corpus /tmp/strap-corpus
//
// -clock cpu times each encode/decode by the thread's CPU clock instead of the wall clock
// (a shared machine's load then slows nothing but the wall); -decoded DIR writes what a
// codec decoded (as float32) for bench/compression/fidelity.py.
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/fse"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

func main() { os.Exit(run()) }

type variant struct {
	label string
	name  string // registry name; "" for a bench-only variant
	opts  codec.Options
	// shared: a basis per module (transform mode 4), fitted from the module's first record,
	// its packet counted in the stored bytes, refitted from a record when the basis missed
	// more than refitShare of its whole rows.
	shared bool
}

// refitShare is the share of a record's whole rows coded directly (the module's basis did not
// carry them within the bound) over which the bench refits the basis from that record.
const refitShare = 0.25

func variants() []variant {
	rel := func(v float64) *codec.LossyBound { return &codec.LossyBound{Mode: "rel", Value: v} }
	return []variant{
		{"lz4", "lz4", codec.Options{}, false},
		{"zstd-fastest", "zstd", codec.Options{Level: 1}, false},
		{"shuffle (huff0)", "shuffle", codec.Options{}, false},
		{"shuffle+zstd1", "shuffle", codec.Options{Level: 1}, false},
		{"shuffle+zstd3", "shuffle", codec.Options{Level: 3}, false},
		{"shuffle+fse*", "", codec.Options{}, false},
		{"fp16", "fp16", codec.Options{}, false},
		{"quant rel 1e-3", "quant", codec.Options{Lossy: rel(1e-3)}, false},
		{"quant rel 1e-3 zstd3", "quant", codec.Options{Level: 3, Lossy: rel(1e-3)}, false},
		{"quant abs 1e-3", "quant", codec.Options{Lossy: &codec.LossyBound{Mode: "abs", Value: 1e-3}}, false},
		{"fp8", "fp8", codec.Options{}, false},
		{"transform", "transform", codec.Options{}, false},
		{"transform 0.05", "transform", codec.Options{Lossy: &codec.LossyBound{Mode: "transform", Value: 0.05}}, false},
		{"transform 0.02", "transform", codec.Options{Lossy: &codec.LossyBound{Mode: "transform", Value: 0.02}}, false},
		{label: "transform shared", name: "transform", opts: codec.Options{}, shared: true},
		{label: "transform shared 0.05", name: "transform", opts: codec.Options{Lossy: &codec.LossyBound{Mode: "transform", Value: 0.05}}, shared: true},
		{label: "transform shared 0.02", name: "transform", opts: codec.Options{Lossy: &codec.LossyBound{Mode: "transform", Value: 0.02}}, shared: true},
	}
}

type tensor struct {
	name  string
	f32   []float32
	shape []int
	// rowLen is the last dimension (a token's vector): fp8's scale per row, the rows of
	// the per-row fidelity table.
	rowLen int
}

type row struct {
	variant, corpus, dt string
	raw, stored         int
	maxAbs, sse, ss     float64
	encDur, decDur      time.Duration
	lossless, blocks    int
	// rowRel, rowCos: each row's relative L2 error and cosine (lossy codecs).
	rowRel, rowCos []float64
	// basisBytes: the shared bases' packets (counted in stored); fits: how many were fitted.
	basisBytes, fits int
	// oosRaw, oosStored: the records coded on a basis fitted from an earlier record of their
	// module (out of sample), basis packets not counted.
	oosRaw, oosStored int
}

// clockCPU selects the thread CPU clock for timings (-clock cpu).
var clockCPU bool

// now is the wall clock, or the calling thread's CPU time under -clock cpu (main locks its
// goroutine to its thread, so that is the work timed, not other processes' load).
func now() time.Duration {
	if clockCPU {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err == nil {
			return time.Duration(ts.Nano())
		}
	}
	return time.Duration(time.Now().UnixNano())
}

func run() int {
	corpusDir := flag.String("corpus", "", "directory written by gen_corpus.py (minilm/, llama/); empty: N(0,1) only")
	blockSize := flag.Int("block", 1<<20, "block size in bytes")
	maxMB := flag.Int("max-mb", 32, "MiB of float32 per corpus to use")
	normalMB := flag.Int("normal-mb", 16, "MiB of float32 N(0,1)")
	only := flag.String("codecs", "", "comma-separated labels to run (default all)")
	reps := flag.Int("reps", 3, "timing repetitions per tensor; the fastest counts (the machine is shared)")
	dump := flag.String("dump", "", "write the stored blocks of the first corpus, every dtype, here (for py_decode.py)")
	clock := flag.String("clock", "wall", "timing clock: wall, or cpu (the thread's CPU time)")
	decoded := flag.String("decoded", "", "write each tensor of the first corpus as decoded (float32) here, per codec and dtype (for fidelity.py)")
	onlyCorpora := flag.String("corpora", "", "comma-separated corpora to run (minilm, llama, normal, normal-25%0; default all)")
	onlyDtypes := flag.String("dtypes", "", "comma-separated dtypes to run (float32, bfloat16, float16; default all)")
	flag.Parse()
	runtime.GOMAXPROCS(1) // per-core figures
	runtime.LockOSThread()
	switch *clock {
	case "wall":
	case "cpu":
		clockCPU = true
	default:
		fmt.Fprintf(os.Stderr, "-clock %q: want wall or cpu\n", *clock)
		return 2
	}
	var fidelity, shared []row

	corpora := map[string][]tensor{"normal": normal(*normalMB<<20, 0), "normal-25%0": normal(*normalMB<<20, 4)}
	order := []string{}
	if *corpusDir != "" {
		for _, c := range []string{"minilm", "llama"} {
			ts, err := load(filepath.Join(*corpusDir, c), *maxMB<<20)
			if err != nil {
				fmt.Fprintf(os.Stderr, "corpus %s: %v\n", c, err)
				return 1
			}
			corpora[c] = ts
			order = append(order, c)
		}
	}
	order = append(order, "normal", "normal-25%0")
	if *onlyCorpora != "" {
		order = slices.DeleteFunc(order, func(c string) bool { return !strings.Contains(","+*onlyCorpora+",", ","+c+",") })
	}
	fmt.Printf("block %d KiB, GOMAXPROCS 1, %s/%s, %s clock\n\n", *blockSize>>10, runtime.GOOS, runtime.GOARCH, *clock)
	fmt.Printf("| codec | corpus | dtype | ratio | max-abs err | rel-L2 err | compress MB/s | decompress MB/s | lossless blocks |\n")
	fmt.Printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range variants() {
		if *only != "" && !strings.Contains(","+*only+",", ","+v.label+",") {
			continue
		}
		for _, cname := range order {
			for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16} {
				if *onlyDtypes != "" && !strings.Contains(","+*onlyDtypes+",", ","+dt.String()+",") {
					continue
				}
				var dumpDir, decDir string
				if *dump != "" && cname == order[0] {
					dumpDir = *dump
				}
				if *decoded != "" && cname == order[0] {
					decDir = filepath.Join(*decoded, sanitize(v.label), dt.String())
				}
				r, err := bench(v, cname, corpora[cname], dt, *blockSize, *reps, dumpDir, decDir)
				if errors.Is(err, codec.ErrUnknownCodec) {
					continue
				}
				if err != nil {
					fmt.Fprintf(os.Stderr, "%s %s %s: %v\n", v.label, cname, dt, err)
					return 1
				}
				rel := 0.0
				if r.ss > 0 {
					rel = math.Sqrt(r.sse / r.ss)
				}
				dec := fmt.Sprintf("%.0f", mbps(r.raw, r.decDur))
				if r.decDur == 0 {
					dec = "–"
				}
				fmt.Printf("| %s | %s | %s | %.3f | %.3g | %.3g | %.0f | %s | %d/%d |\n", v.label, cname, dt,
					float64(r.raw)/float64(r.stored), r.maxAbs, rel, mbps(r.raw, r.encDur), dec, r.lossless, r.blocks)
				if r.fits > 0 {
					shared = append(shared, r)
				}
				if len(r.rowRel) > 0 && r.sse > 0 {
					fidelity = append(fidelity, r)
				}
			}
		}
	}
	if len(shared) > 0 {
		fmt.Printf("\nShared bases (transform mode 4): basis packets counted in the ratio above; the ratio without them is the limit of a capture with many records per module\n\n")
		fmt.Printf("| codec | corpus | dtype | bases fitted | basis bytes | share of stored | ratio without basis packets | records after their module's fit record: MiB, ratio |\n|---|---|---|---:|---:|---:|---:|---|\n")
		for _, r := range shared {
			oos := "–"
			if r.oosStored > 0 {
				oos = fmt.Sprintf("%.1f MiB, %.3f", float64(r.oosRaw)/(1<<20), float64(r.oosRaw)/float64(r.oosStored))
			}
			fmt.Printf("| %s | %s | %s | %d | %d | %.1f %% | %.3f | %s |\n", r.variant, r.corpus, r.dt, r.fits, r.basisBytes,
				100*float64(r.basisBytes)/float64(r.stored), float64(r.raw)/float64(r.stored-r.basisBytes), oos)
		}
	}
	if len(fidelity) > 0 {
		fmt.Printf("\nPer-row fidelity (a row = a tensor's last dimension; percentiles nearest-rank over all rows)\n\n")
		fmt.Printf("| codec | corpus | dtype | rows | rel-L2 p50 | rel-L2 p99 | rel-L2 max | cos min | cos p1 | cos p50 |\n")
		fmt.Printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range fidelity {
			slices.Sort(r.rowRel)
			slices.Sort(r.rowCos)
			fmt.Printf("| %s | %s | %s | %d | %.4f | %.4f | %.4f | %.6f | %.6f | %.6f |\n", r.variant, r.corpus, r.dt,
				len(r.rowRel), rank(r.rowRel, 0.5), rank(r.rowRel, 0.99), r.rowRel[len(r.rowRel)-1],
				r.rowCos[0], rank(r.rowCos, 0.01), rank(r.rowCos, 0.5))
		}
	}
	return 0
}

// rank is the nearest-rank p-quantile of sorted v.
func rank(v []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}

func mbps(n int, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

// normal is N(0,1) float32; zeroEvery > 0 sets every zeroEvery-th value to 0 (the design
// notes' "25% zeros" baseline uses 4).
func normal(bytes, zeroEvery int) []tensor {
	r := rand.New(rand.NewPCG(1, 2))
	var ts []tensor
	for left := bytes / 4; left > 0; left -= 1 << 20 {
		v := make([]float32, min(left, 1<<20))
		for i := range v {
			v[i] = float32(r.NormFloat64())
			if zeroEvery > 0 && i%zeroEvery == 0 {
				v[i] = 0
			}
		}
		ts = append(ts, tensor{name: "normal", f32: v, shape: []int{len(v) / 1024, 1024}, rowLen: 1024})
	}
	return ts
}

func load(dir string, budget int) ([]tensor, error) {
	j, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	var m []struct {
		File, Name string
		Shape      []int
	}
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	var ts []tensor
	for _, e := range m {
		b, err := os.ReadFile(filepath.Join(dir, e.File))
		if err != nil {
			return nil, fmt.Errorf("tensor: %w", err)
		}
		if budget -= len(b); budget < 0 {
			break
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		rowLen := len(v)
		if len(e.Shape) > 0 && e.Shape[len(e.Shape)-1] > 0 {
			rowLen = e.Shape[len(e.Shape)-1]
		}
		ts = append(ts, tensor{name: e.Name, f32: v, shape: e.Shape, rowLen: rowLen})
	}
	return ts, nil
}

// encodeAs stores float32 values as dt (round to nearest even; fp16 overflow gives inf,
// which the codecs then carry exactly).
func encodeAs(v []float32, dt dtype.DType) []byte {
	switch dt {
	case dtype.Float32:
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b
	case dtype.BFloat16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			u := math.Float32bits(x)
			binary.LittleEndian.PutUint16(b[2*i:], uint16((u+0x7fff+(u>>16)&1)>>16))
		}
		return b
	case dtype.Float16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], dtype.Float32ToFloat16(x))
		}
		return b
	}
	panic("dtype")
}

func bench(v variant, cname string, ts []tensor, dt dtype.DType, bs, reps int, dumpDir, decDir string) (row, error) {
	r := row{variant: v.label, corpus: cname, dt: dt.String()}
	var c codec.Codec
	if v.name != "" {
		var err error
		if c, err = codec.New(v.name, v.opts); err != nil {
			return r, err
		}
	}
	type blk struct {
		stored []byte
		raw    []byte
	}
	var dumpEntries, decEntries []map[string]any
	if dumpDir != "" && dt != dtype.Float32 {
		dumpDir = filepath.Join(dumpDir, sanitize(v.label)+"_"+dt.String())
	} else if dumpDir != "" {
		dumpDir = filepath.Join(dumpDir, sanitize(v.label))
	}
	bases := map[string]*codec.SharedBasis{} // shared variants: the module's basis
	for ti, t := range ts {
		src := encodeAs(t.f32, dt)
		var blocks []blk
		var lossless, misses, whole int
		var fit time.Duration
		oos := bases[t.name] != nil
		if v.shared && bases[t.name] == nil {
			start := now()
			sb, err := codec.FitSharedBasis(src, dt, t.rowLen, c.(codec.LossyCodec).Bound().Value)
			fit = now() - start
			if err == nil {
				bases[t.name] = sb
				r.basisBytes += len(sb.Packet())
				r.stored += len(sb.Packet())
				r.fits++
			}
		}
		dc, sb := c, bases[t.name]
		best := time.Duration(math.MaxInt64)
		for range reps {
			blocks, lossless, misses = blocks[:0], 0, 0
			tc := c
			start := now()
			if rp, ok := c.(codec.RowPreparer); ok {
				var err error
				if tc, err = rp.ForRows(src, dt, t.rowLen, 0); err != nil {
					return r, err
				}
			} else if tp, ok := c.(codec.TensorPreparer); ok {
				var err error
				if tc, err = tp.ForTensor(src, dt); err != nil {
					return r, err
				}
			}
			if sb != nil {
				tc = tc.(codec.BasisUser).WithBasis(sb)
			}
			dc = tc
			for off := 0; off < len(src); off += bs {
				b := src[off:min(off+bs, len(src))]
				var (
					out []byte
					ok  bool
					st  codec.BlockStats
					err error
				)
				switch se := tc.(type) {
				case nil:
					out, ok = fseShuffle(b, dt)
				case codec.StatsEncoder:
					out, ok, st, err = se.EncodeStats(nil, b, dt)
				default:
					out, ok, err = tc.Encode(nil, b, dt)
				}
				if err != nil {
					return r, fmt.Errorf("encode: %w", err)
				}
				if !ok {
					out = nil
				}
				if st.Lossless {
					lossless++
				}
				misses += st.SharedMisses
				blocks = append(blocks, blk{out, b})
			}
			best = min(best, now()-start)
		}
		r.encDur += best + fit
		whole = len(t.f32) / max(1, t.rowLen)
		if v.shared && float64(misses) > refitShare*float64(whole) {
			delete(bases, t.name) // refitted from the module's next record
		}
		r.lossless += lossless
		r.blocks += len(blocks)
		var dec []byte
		best = time.Duration(math.MaxInt64)
		for range reps {
			dec = dec[:0]
			start := now()
			for _, b := range blocks {
				switch {
				case b.stored == nil:
					dec = append(dec, b.raw...)
				case c == nil:
					var err error
					if dec, err = fseUnshuffle(dec, b.stored, dt, len(b.raw)); err != nil {
						return r, err
					}
				default:
					var err error
					if dec, err = dc.Decode(dec, b.stored, dt, len(b.raw)); err != nil {
						return r, fmt.Errorf("decode: %w", err)
					}
				}
			}
			best = min(best, now()-start)
		}
		r.decDur += best
		for _, b := range blocks {
			n := len(b.stored)
			if b.stored == nil {
				n = len(b.raw)
			}
			r.raw += len(b.raw)
			r.stored += n
			if oos {
				r.oosRaw += len(b.raw)
				r.oosStored += n
			}
		}
		errStats(&r, src, dec, dt, t.rowLen)
		if decDir != "" {
			if err := os.MkdirAll(decDir, 0o755); err != nil {
				return r, err
			}
			f := fmt.Sprintf("%d.f32", ti)
			if err := os.WriteFile(filepath.Join(decDir, f), asF32(dec, dt), 0o644); err != nil {
				return r, err
			}
			decEntries = append(decEntries, map[string]any{"file": f, "name": t.name, "shape": t.shape})
		}
		if dumpDir != "" && c != nil {
			for bi, b := range blocks {
				if b.stored == nil || len(dumpEntries) >= 24 {
					continue
				}
				d := dumpDir
				if err := os.MkdirAll(d, 0o755); err != nil {
					return r, err
				}
				f := fmt.Sprintf("%d_%d.stored", ti, bi)
				if err := os.WriteFile(filepath.Join(d, f), b.stored, 0o644); err != nil {
					return r, err
				}
				sum := sha256.Sum256(dec[bi*bs : bi*bs+len(b.raw)])
				e := map[string]any{"file": f, "codec_id": int(c.ID()),
					"dtype": dt.String(), "raw_len": len(b.raw), "go_sha256": hex.EncodeToString(sum[:])}
				if sb != nil && b.stored[0] == 4 { // mode 4: the reader needs the module's basis packet
					bf := fmt.Sprintf("basis_%08x.bin", sb.CRC())
					if err := os.WriteFile(filepath.Join(d, bf), sb.Packet(), 0o644); err != nil {
						return r, err
					}
					e["basis"] = bf
				}
				dumpEntries = append(dumpEntries, e)
			}
		}
	}
	if dumpEntries != nil {
		j, _ := json.MarshalIndent(dumpEntries, "", " ")
		if err := os.WriteFile(filepath.Join(dumpDir, "manifest.json"), j, 0o644); err != nil {
			return r, err
		}
	}
	if decEntries != nil {
		j, _ := json.MarshalIndent(decEntries, "", " ")
		if err := os.WriteFile(filepath.Join(decDir, "manifest.json"), j, 0o644); err != nil {
			return r, err
		}
	}
	return r, nil
}

// asF32 widens decoded elements of dt to little-endian float32.
func asF32(b []byte, dt dtype.DType) []byte {
	if dt == dtype.Float32 {
		return b
	}
	n := len(b) / dt.Size()
	out := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(load1(b, dt, i))))
	}
	return out
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '(' || r == ')' || r == '+' {
			return '_'
		}
		return r
	}, s)
}

// errStats adds the error of dec against src to r, overall and per row of rowLen values.
func errStats(r *row, src, dec []byte, dt dtype.DType, rowLen int) {
	w := dt.Size()
	n := len(src) / w
	for lo := 0; lo < n; lo += rowLen {
		var ss, sse, dot, ssy float64
		for i := lo; i < min(n, lo+rowLen); i++ {
			x, y := load1(src, dt, i), load1(dec, dt, i)
			if math.IsInf(x, 0) || math.IsNaN(x) {
				continue
			}
			e := math.Abs(x - y)
			r.maxAbs = max(r.maxAbs, e)
			sse += e * e
			ss += x * x
			dot += x * y
			ssy += y * y
		}
		r.sse += sse
		r.ss += ss
		switch {
		case ss > 0 && ssy > 0:
			r.rowRel = append(r.rowRel, math.Sqrt(sse/ss))
			r.rowCos = append(r.rowCos, dot/math.Sqrt(ss*ssy))
		case ss == 0 && ssy == 0:
			r.rowRel = append(r.rowRel, 0)
			r.rowCos = append(r.rowCos, 1)
		default:
			r.rowRel = append(r.rowRel, math.Sqrt(sse/max(ss, math.SmallestNonzeroFloat64)))
			r.rowCos = append(r.rowCos, 0)
		}
	}
}

func load1(b []byte, dt dtype.DType, i int) float64 {
	switch dt {
	case dtype.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case dtype.BFloat16:
		return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
	}
	return float64(dtype.Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
}

// --- bench-only: byte planes entropy-coded with FSE (klauspost/compress/fse). ---
// Not a stored format: Python has no fast FSE decoder outside zstd, which uses FSE only for
// sequences. It is here to show what FSE would gain over Huffman on the same planes.

func fseShuffle(b []byte, dt dtype.DType) ([]byte, bool) {
	w := dt.Size()
	n := len(b) / w
	var out []byte
	var s fse.Scratch
	for j := range w {
		p := make([]byte, n)
		for i := range n {
			v := rot(b, dt, i)
			p[i] = byte(v >> (8 * j))
		}
		c, err := fse.Compress(p, &s)
		switch {
		case err == nil:
			out = binary.LittleEndian.AppendUint32(out, uint32(len(c)))
			out = append(out, c...)
		case errors.Is(err, fse.ErrUseRLE):
			out = binary.LittleEndian.AppendUint32(out, 1<<31|1)
			out = append(out, p[0])
		default:
			out = binary.LittleEndian.AppendUint32(out, 1<<30|uint32(len(p)))
			out = append(out, p...)
		}
	}
	return out, len(out) < len(b)
}

func rot(b []byte, dt dtype.DType, i int) uint32 {
	if dt.Size() == 4 {
		u := binary.LittleEndian.Uint32(b[4*i:])
		return u<<1 | u>>31
	}
	u := uint32(binary.LittleEndian.Uint16(b[2*i:]))
	return (u<<1 | u>>15) & 0xffff
}

func fseUnshuffle(dst, s []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	w := dt.Size()
	n := rawLen / w
	planes := make([][]byte, w)
	var sc fse.Scratch
	for j := range w {
		h := binary.LittleEndian.Uint32(s)
		s = s[4:]
		switch {
		case h&(1<<31) != 0:
			p := make([]byte, n)
			for i := range p {
				p[i] = s[0]
			}
			planes[j], s = p, s[1:]
		case h&(1<<30) != 0:
			planes[j], s = s[:n], s[n:]
		default:
			p, err := fse.Decompress(s[:h], &sc)
			if err != nil {
				return nil, err
			}
			planes[j], s = append([]byte(nil), p...), s[h:]
		}
	}
	for i := range n {
		var v uint32
		for j := range w {
			v |= uint32(planes[j][i]) << (8 * j)
		}
		if w == 4 {
			v = v>>1 | v<<31
			dst = binary.LittleEndian.AppendUint32(dst, v)
		} else {
			v = (v>>1 | v<<15) & 0xffff
			dst = binary.LittleEndian.AppendUint16(dst, uint16(v))
		}
	}
	return dst, nil
}
