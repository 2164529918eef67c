package stream

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/dtype"
)

// TestInspectLossy: Inspect folds the "lossy" packet meta per module and overall, and
// counts a packet over its bound.
func TestInspectLossy(t *testing.T) {
	f := tempFile(t)
	w, err := New(f, map[string]any{"codec": "quant"})
	if err != nil {
		t.Fatal(err)
	}
	packets := []struct {
		name, meta string
	}{
		{"a", `{"lossy":{"mode":"rel","bound":0.001,"max_abs_err":0.002,"rel_l2_err":0.0009,"blocks":1,"lossless_blocks":0}}`},
		{"a", `{"lossy":{"mode":"rel","bound":0.001,"max_abs_err":0.004,"rel_l2_err":0.0007,"blocks":2,"lossless_blocks":1}}`},
		{"b", `{"positions":[0,2],"lossy":{"mode":"rel","bound":0.001,"max_abs_err":0.001,"rel_l2_err":0.0011,"blocks":1,"lossless_blocks":0}}`},
		{"c", ``},
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
	want := map[string]*LossyStats{
		"a": {Mode: "rel", Bound: 0.001, MaxAbsErr: 0.004, RelL2Err: 0.0009, Packets: 2, LosslessBlocks: 1},
		"b": {Mode: "rel", Bound: 0.001, MaxAbsErr: 0.001, RelL2Err: 0.0011, Packets: 1, Exceeded: 1},
		"c": nil,
	}
	for _, m := range sum.Modules {
		t.Run(m.Name, func(t *testing.T) {
			w := want[m.Name]
			if (w == nil) != (m.Lossy == nil) || w != nil && *w != *m.Lossy {
				t.Fatalf("lossy %+v, want %+v", m.Lossy, w)
			}
		})
	}
	tot := LossyStats{Mode: "rel", Bound: 0.001, MaxAbsErr: 0.004, RelL2Err: 0.0011, Packets: 3, LosslessBlocks: 1, Exceeded: 1}
	if sum.Lossy == nil || *sum.Lossy != tot {
		t.Fatalf("total lossy %+v, want %+v", sum.Lossy, tot)
	}
	var buf bytes.Buffer
	if err := sum.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"rel 0.001", "0.0011", "1 packets exceed their error bound"} {
		if !bytes.Contains(buf.Bytes(), []byte(s)) {
			t.Errorf("text lacks %q:\n%s", s, buf.String())
		}
	}
}

func TestLossyExceeds(t *testing.T) {
	tests := []struct {
		name string
		r    lossyReport
		want bool
	}{
		{"abs within", lossyReport{Mode: "abs", Bound: 0.01, MaxAbsErr: 0.01, RelL2Err: 5}, false},
		{"abs over", lossyReport{Mode: "abs", Bound: 0.01, MaxAbsErr: 0.0101}, true},
		{"rel within", lossyReport{Mode: "rel", Bound: 1e-3, MaxAbsErr: 9, RelL2Err: 1e-3}, false},
		{"rel over", lossyReport{Mode: "rel", Bound: 1e-3, RelL2Err: 1.0001e-3}, true},
		{"fp16 unbounded", lossyReport{Mode: "fp16", RelL2Err: 0.1}, false},
		{"fp16 bounded over", lossyReport{Mode: "fp16", Bound: 1e-4, RelL2Err: 2e-4}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.exceeds(); got != tc.want {
				t.Fatalf("exceeds = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestInspectGGML: a uint8 tensor whose meta names a ggml type (raw quantized blocks,
// STREAM_FORMAT.md 4.1) shows that type; the same meta on another dtype does not count.
func TestInspectGGML(t *testing.T) {
	f := tempFile(t)
	w, err := New(f, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	packets := []struct {
		name string
		dt   dtype.DType
		meta string
	}{
		{"blk.0.attn_q.weight", dtype.Uint8, `{"ggml_type":"q4_0","ggml_ne":[8,1]}`},
		{"blk.0.attn_q.weight", dtype.Uint8, `{"ggml_type":"q8_0","ggml_ne":[8,1]}`},
		{"l_out-0", dtype.Uint8, ``},
		{"other", dtype.Int32, `{"ggml_type":"q4_0"}`},
	}
	payload := f32Bytes(1)
	for i, p := range packets {
		if err := w.WritePacket(&Packet{Header: Header{Type: TypeTensor, DType: p.dt, Shape: []uint64{4 / uint64(p.dt.Size())}, Seq: uint64(i + 1), RawLen: 4}, Name: p.name, Meta: []byte(p.meta), Blocks: []Block{{Data: payload}}}); err != nil {
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
	want := map[string]string{"blk.0.attn_q.weight": "q4_0,q8_0", "l_out-0": "", "other": ""}
	for _, m := range sum.Modules {
		if got := strings.Join(m.GGMLTypes, ","); got != want[m.Name] {
			t.Errorf("%s: ggml types %q, want %q", m.Name, got, want[m.Name])
		}
	}
	var buf bytes.Buffer
	if err := sum.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "uint8 (ggml q4_0,q8_0)") {
		t.Fatalf("text summary without the ggml types:\n%s", buf.String())
	}
}
