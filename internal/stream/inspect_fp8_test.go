package stream

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// TestInspectRows: the per-row error reports of fp8 packets fold per module and overall
// (rows summed, max/min exact, percentiles the worst packet's); a packet with a row over
// an fp8 cap counts as exceeded.
func TestInspectRows(t *testing.T) {
	f := tempFile(t)
	w, err := New(f, map[string]any{"codec": "fp8"})
	if err != nil {
		t.Fatal(err)
	}
	rows := func(n int, mx, p50, p99, cmin, c50, c01 string) string {
		return `"rows":{"n":` + string(rune('0'+n)) + `,"rel_l2_max":` + mx + `,"rel_l2_p50":` + p50 + `,"rel_l2_p99":` + p99 +
			`,"cos_min":` + cmin + `,"cos_p50":` + c50 + `,"cos_p01":` + c01 + `}`
	}
	packets := []struct{ name, meta string }{
		{"a", `{"lossy":{"mode":"fp8","bound":0.04,"max_abs_err":0.1,"rel_l2_err":0.02,"blocks":1,"lossless_blocks":0,` + rows(3, "0.03", "0.02", "0.03", "0.9995", "0.9998", "0.9995") + `}}`},
		{"a", `{"lossy":{"mode":"fp8","bound":0.04,"max_abs_err":0.2,"rel_l2_err":0.025,"blocks":1,"lossless_blocks":0,` + rows(2, "0.035", "0.01", "0.035", "0.9993", "0.9999", "0.9993") + `}}`},
		{"b", `{"lossy":{"mode":"fp8","bound":0.04,"max_abs_err":0.2,"rel_l2_err":0.03,"blocks":1,"lossless_blocks":0,` + rows(1, "0.05", "0.05", "0.05", "0.998", "0.998", "0.998") + `}}`},
	}
	payload := f32Bytes(1, 2, 3, 4)
	for i, p := range packets {
		if err := w.WritePacket(&Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{4}, Seq: uint64(i + 1), RawLen: uint64(len(payload))}, Name: p.name, Meta: []byte(p.meta), Blocks: []Block{{Data: payload}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	sum, err := InspectFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	wantA := RowStats{N: 5, RelL2Max: 0.035, RelL2P50: 0.02, RelL2P99: 0.035, CosMin: 0.9993, CosP50: 0.9998, CosP01: 0.9993}
	for _, m := range sum.Modules {
		if m.Name == "a" && (m.Lossy.Rows == nil || *m.Lossy.Rows != wantA || m.Lossy.Exceeded != 0) {
			t.Fatalf("a: rows %+v exceeded %d, want %+v", m.Lossy.Rows, m.Lossy.Exceeded, wantA)
		}
		if m.Name == "b" && m.Lossy.Exceeded != 1 {
			t.Fatalf("b: a row at 0.05 over the 0.04 cap not counted: %+v", m.Lossy)
		}
	}
	if r := sum.Lossy.Rows; r == nil || r.N != 6 || r.RelL2Max != 0.05 || r.CosMin != 0.998 {
		t.Fatalf("total rows %+v", r)
	}
	var buf bytes.Buffer
	if err := sum.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); !strings.Contains(s, "per-row error") || !strings.Contains(s, "0.999300") || !strings.Contains(s, "exceed their error bound") {
		t.Fatalf("text:\n%s", s)
	}
}
