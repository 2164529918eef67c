package stream

import (
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// TestInspectTransformRows: transform packets (a per-row rel-L2 bound) fold their rows as
// fp8's do, and a packet whose worst row is over its bound counts as exceeded even when its
// whole-packet rel-L2 is under it.
func TestInspectTransformRows(t *testing.T) {
	f := tempFile(t)
	w, err := New(f, map[string]any{"codec": "transform"})
	if err != nil {
		t.Fatal(err)
	}
	meta := func(relL2, rowMax, cosMin string) string {
		return `{"lossy":{"mode":"transform","bound":0.1,"max_abs_err":0.5,"rel_l2_err":` + relL2 +
			`,"blocks":1,"lossless_blocks":0,"rows":{"n":4,"rel_l2_max":` + rowMax +
			`,"rel_l2_p50":0.09,"rel_l2_p99":` + rowMax + `,"cos_min":` + cosMin + `,"cos_p50":0.996,"cos_p01":` + cosMin + `}}}`
	}
	packets := []struct{ name, meta string }{
		{"ok", meta("0.09", "0.0999", "0.99501")},
		{"over", meta("0.09", "0.12", "0.9928")},
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
	for _, m := range sum.Modules {
		want := map[string]uint64{"ok": 0, "over": 1}[m.Name]
		if m.Lossy == nil || m.Lossy.Exceeded != want || m.Lossy.Rows == nil || m.Lossy.Rows.N != 4 {
			t.Fatalf("%s: %+v, want %d exceeded and 4 rows", m.Name, m.Lossy, want)
		}
	}
	if r := sum.Lossy.Rows; r == nil || r.N != 8 || r.RelL2Max != 0.12 || r.CosMin != 0.9928 {
		t.Fatalf("total rows %+v", r)
	}
}
