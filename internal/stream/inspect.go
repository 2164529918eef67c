package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/strap-llm/strap/internal/dtype"
)

// maxShapes caps the distinct shapes listed per module.
const maxShapes = 16

// ModuleStats sums the TENSOR packets of one module name.
type ModuleStats struct {
	Name    string `json:"name"`
	Packets uint64 `json:"packets"`
	// DTypes lists the element types seen (one, normally).
	DTypes []string `json:"dtypes"`
	// Shapes lists the distinct whole-tensor shapes seen, first maxShapes.
	Shapes      [][]uint64 `json:"shapes"`
	RawBytes    uint64     `json:"raw_bytes"`
	StoredBytes uint64     `json:"stored_bytes"`
	// Ratio is raw over stored bytes (0 when nothing is stored).
	Ratio float64 `json:"ratio"`
	// Lossy folds the lossy error reports of the module's packets; nil when lossless.
	Lossy *LossyStats `json:"lossy,omitempty"`
	// GGMLTypes lists the ggml types of packets holding raw ggml blocks (uint8 tensors whose
	// meta names a "ggml_type", STREAM_FORMAT.md 4.1); empty otherwise.
	GGMLTypes []string `json:"ggml_types,omitempty"`
}

// LossyStats folds the "lossy" meta that strapd writes on every packet of a lossy codec
// (docs/COMPRESSION.md 6): the bound asked for and the errors achieved.
type LossyStats struct {
	// Mode and Bound are what the user asked for ("abs", "rel", "fp16", "fp8" or "transform").
	Mode  string  `json:"mode"`
	Bound float64 `json:"bound"`
	// MaxAbsErr is the largest absolute error of any packet.
	MaxAbsErr float64 `json:"max_abs_err"`
	// RelL2Err is the worst packet's relative L2 error.
	RelL2Err float64 `json:"rel_l2_err"`
	// Packets counts the packets with a report; LosslessBlocks the blocks stored exactly
	// (flagged fallbacks).
	Packets        uint64 `json:"packets"`
	LosslessBlocks uint64 `json:"lossless_blocks"`
	// Exceeded counts packets whose achieved error is over the bound (a codec bug).
	Exceeded uint64 `json:"exceeded"`
	// Unreadable counts packets whose "lossy" meta could not be parsed.
	Unreadable uint64 `json:"unreadable,omitempty"`
	// Rows folds the per-row errors of codecs that code by rows (fp8); nil otherwise.
	Rows *RowStats `json:"rows,omitempty"`
}

// RowStats folds the packets' per-row error reports (docs/COMPRESSION.md 6, "rows"): N
// sums the rows, RelL2Max and CosMin are exact over all of them; the percentiles are the
// worst packet's (largest p50/p99 of rel-L2, smallest p50/p1 of cosine), since packet
// percentiles do not combine exactly.
type RowStats struct {
	N        uint64  `json:"n"`
	RelL2Max float64 `json:"rel_l2_max"`
	RelL2P50 float64 `json:"rel_l2_p50"`
	RelL2P99 float64 `json:"rel_l2_p99"`
	CosMin   float64 `json:"cos_min"`
	CosP50   float64 `json:"cos_p50"`
	CosP01   float64 `json:"cos_p01"`
}

func (s *RowStats) add(r *RowStats) {
	if s.N == 0 {
		*s = *r
		return
	}
	s.N += r.N
	s.RelL2Max, s.RelL2P50, s.RelL2P99 = max(s.RelL2Max, r.RelL2Max), max(s.RelL2P50, r.RelL2P50), max(s.RelL2P99, r.RelL2P99)
	s.CosMin, s.CosP50, s.CosP01 = min(s.CosMin, r.CosMin), min(s.CosP50, r.CosP50), min(s.CosP01, r.CosP01)
}

// addGGML notes the ggml type of a packet that holds raw ggml blocks: a uint8 tensor whose
// meta carries "ggml_type" (STREAM_FORMAT.md 4.1, written by the C client).
func addGGML(m *ModuleStats, p *PacketInfo) {
	if p.DType != dtype.Uint8 || !bytes.Contains(p.Meta, []byte(`"ggml_type"`)) {
		return
	}
	var g struct {
		Type string `json:"ggml_type"`
	}
	if json.Unmarshal(p.Meta, &g) == nil && g.Type != "" && !slices.Contains(m.GGMLTypes, g.Type) {
		m.GGMLTypes = append(m.GGMLTypes, g.Type)
	}
}

// lossyReport is one packet's "lossy" meta.
type lossyReport struct {
	Mode           string    `json:"mode"`
	Bound          float64   `json:"bound"`
	MaxAbsErr      float64   `json:"max_abs_err"`
	RelL2Err       float64   `json:"rel_l2_err"`
	LosslessBlocks uint64    `json:"lossless_blocks"`
	Rows           *RowStats `json:"rows"`
}

// exceeds reports whether the achieved error is over the bound: abs compares the max
// absolute error, rel (and fp16 with a value) the relative L2 error.
func (r lossyReport) exceeds() bool {
	switch {
	case r.Mode == "abs":
		return r.MaxAbsErr > r.Bound
	case r.Mode == "rel", r.Mode == "fp16" && r.Bound > 0:
		return r.RelL2Err > r.Bound
	case (r.Mode == "fp8" || r.Mode == "transform") && r.Bound > 0:
		return r.RelL2Err > r.Bound || r.Rows != nil && r.Rows.RelL2Max > r.Bound
	}
	return false
}

// add folds one packet's meta into *ls (allocated on first use). Packets without a
// "lossy" key leave it untouched.
func addLossy(ls **LossyStats, meta []byte) {
	if len(meta) == 0 || !bytes.Contains(meta, []byte(`"lossy"`)) {
		return
	}
	var m struct {
		Lossy *lossyReport `json:"lossy"`
	}
	err := json.Unmarshal(meta, &m)
	if err == nil && m.Lossy == nil {
		return
	}
	if *ls == nil {
		*ls = &LossyStats{}
	}
	s := *ls
	if err != nil {
		s.Unreadable++
		return
	}
	r := m.Lossy
	if s.Packets == 0 {
		s.Mode, s.Bound = r.Mode, r.Bound
	}
	s.Packets++
	s.MaxAbsErr = max(s.MaxAbsErr, r.MaxAbsErr)
	s.RelL2Err = max(s.RelL2Err, r.RelL2Err)
	s.LosslessBlocks += r.LosslessBlocks
	if r.Rows != nil && r.Rows.N > 0 {
		if s.Rows == nil {
			s.Rows = &RowStats{}
		}
		s.Rows.add(r.Rows)
	}
	if r.exceeds() {
		s.Exceeded++
	}
}

// Summary is what Inspect found.
type Summary struct {
	Size int64          `json:"size"`
	Meta map[string]any `json:"meta"`
	// Modules is sorted by name.
	Modules []ModuleStats `json:"modules"`
	// Packets, RawBytes, StoredBytes, Ratio: totals over TENSOR packets.
	Packets     uint64  `json:"packets"`
	RawBytes    uint64  `json:"raw_bytes"`
	StoredBytes uint64  `json:"stored_bytes"`
	Ratio       float64 `json:"ratio"`
	// Drops and DroppedBytes: DROP packets and the bytes they lost.
	Drops        uint64 `json:"drops"`
	DroppedBytes uint64 `json:"dropped_bytes"`
	Tokens       uint64 `json:"tokens"`
	// Lossy folds every lossy packet's error report; nil for a lossless stream.
	Lossy *LossyStats `json:"lossy,omitempty"`
	// End is the END meta; nil when the stream was cut short.
	End *EndMeta `json:"end"`
	// Error is why the walk stopped early, empty when it reached the end.
	Error string `json:"error,omitempty"`
}

// Inspect summarizes the stream in r from packet headers alone (no CRC check, no decoding:
// that is Verify's job), so it is quick on large files.
func Inspect(r io.ReaderAt, size int64) (Summary, error) {
	rd, err := NewReader(r, size)
	if err != nil {
		return Summary{}, err
	}
	sum := Summary{Size: size, Meta: rd.header.Meta}
	mods := map[string]*ModuleStats{}
	s := rd.Scan(true)
	for s.Next() {
		p := s.Packet()
		switch p.Type {
		case TypeTensor:
			m := mods[p.Name]
			if m == nil {
				m = &ModuleStats{Name: p.Name}
				mods[p.Name] = m
			}
			m.Packets++
			m.RawBytes += p.RawLen
			m.StoredBytes += p.StoredLen
			if dt := p.DType.String(); !slices.Contains(m.DTypes, dt) {
				m.DTypes = append(m.DTypes, dt)
			}
			if len(m.Shapes) < maxShapes && !slices.ContainsFunc(m.Shapes, func(s []uint64) bool { return slices.Equal(s, p.Shape) }) {
				m.Shapes = append(m.Shapes, append([]uint64{}, p.Shape...))
			}
			addLossy(&m.Lossy, p.Meta)
			addLossy(&sum.Lossy, p.Meta)
			addGGML(m, p)
			sum.Packets++
			sum.RawBytes += p.RawLen
			sum.StoredBytes += p.StoredLen
		case TypeDrop:
			sum.Drops++
			sum.DroppedBytes += p.RawLen
		case TypeToken:
			sum.Tokens++
		case TypeEnd:
			var em EndMeta
			if err := json.Unmarshal(p.Meta, &em); err == nil {
				sum.End = &em
			}
		}
	}
	if err := s.Err(); err != nil {
		sum.Error = err.Error()
	}
	for _, m := range mods {
		m.Ratio = ratio(m.RawBytes, m.StoredBytes)
		sum.Modules = append(sum.Modules, *m)
	}
	slices.SortFunc(sum.Modules, func(a, b ModuleStats) int { return strings.Compare(a.Name, b.Name) })
	sum.Ratio = ratio(sum.RawBytes, sum.StoredBytes)
	return sum, nil
}

// InspectFile opens path and inspects it.
func InspectFile(path string) (Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return Summary{}, fmt.Errorf("open stream: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Summary{}, fmt.Errorf("stat stream: %w", err)
	}
	s, err := Inspect(f, st.Size())
	if err != nil {
		return Summary{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func ratio(raw, stored uint64) float64 {
	if stored == 0 {
		return 0
	}
	return float64(raw) / float64(stored)
}

func shapeString(s []uint64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// WriteText prints the summary as a table for people.
func (sum *Summary) WriteText(w io.Writer) error {
	if len(sum.Meta) > 0 {
		keys := make([]string, 0, len(sum.Meta))
		for k := range sum.Meta {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v, _ := json.Marshal(sum.Meta[k])
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "module\tpackets\tdtype\tshape\traw bytes\tstored bytes\tratio\t")
	for _, m := range sum.Modules {
		shapes := make([]string, len(m.Shapes))
		for i, s := range m.Shapes {
			shapes[i] = shapeString(s)
		}
		dts := strings.Join(m.DTypes, ",")
		if len(m.GGMLTypes) > 0 {
			dts += " (ggml " + strings.Join(m.GGMLTypes, ",") + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%.3f\t\n", m.Name, m.Packets, dts,
			strings.Join(shapes, " "), m.RawBytes, m.StoredBytes, m.Ratio)
	}
	fmt.Fprintf(tw, "total\t%d\t\t\t%d\t%d\t%.3f\t\n", sum.Packets, sum.RawBytes, sum.StoredBytes, sum.Ratio)
	if err := tw.Flush(); err != nil {
		return err
	}
	if sum.Lossy != nil {
		fmt.Fprintln(w)
		lt := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(lt, "module\tbound\tmax abs err\trel L2 err\tpackets\tlossless blocks\texceeded\t")
		row := func(name string, l *LossyStats) {
			fmt.Fprintf(lt, "%s\t%s %g\t%.3g\t%.3g\t%d\t%d\t%d\t\n", name, l.Mode, l.Bound, l.MaxAbsErr, l.RelL2Err,
				l.Packets, l.LosslessBlocks, l.Exceeded)
		}
		for _, m := range sum.Modules {
			if m.Lossy != nil {
				row(m.Name, m.Lossy)
			}
		}
		row("total", sum.Lossy)
		if err := lt.Flush(); err != nil {
			return err
		}
		if sum.Lossy.Exceeded > 0 {
			fmt.Fprintf(w, "WARNING: %d packets exceed their error bound\n", sum.Lossy.Exceeded)
		}
		if sum.Lossy.Rows != nil {
			fmt.Fprintln(w, "\nper-row error (p50/p99/p1: the worst packet's)")
			rt := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(rt, "module\trows\trel L2 max\trel L2 p50\trel L2 p99\tcos min\tcos p50\tcos p1\t")
			row := func(name string, r *RowStats) {
				fmt.Fprintf(rt, "%s\t%d\t%.4g\t%.4g\t%.4g\t%.6f\t%.6f\t%.6f\t\n", name, r.N, r.RelL2Max, r.RelL2P50,
					r.RelL2P99, r.CosMin, r.CosP50, r.CosP01)
			}
			for _, m := range sum.Modules {
				if m.Lossy != nil && m.Lossy.Rows != nil {
					row(m.Name, m.Lossy.Rows)
				}
			}
			row("total", sum.Lossy.Rows)
			if err := rt.Flush(); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(w, "\ndrops: %d packets, %d bytes lost; tokens: %d\n", sum.Drops, sum.DroppedBytes, sum.Tokens)
	if sum.End != nil {
		fmt.Fprintf(w, "end: %s (packets %d, drops %d)", sum.End.Status, sum.End.Packets, sum.End.Drops)
		if sum.End.Error != "" {
			fmt.Fprintf(w, ": %s", sum.End.Error)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "end: none (stream cut short)")
	}
	if sum.Error != "" {
		fmt.Fprintf(w, "stopped early: %s\n", sum.Error)
	}
	_, err := fmt.Fprint(w)
	return err
}
