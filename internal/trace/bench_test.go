package trace

import (
	"io"
	"testing"
)

// BenchmarkWriterWrite encodes and writes one full snapshot line per iteration.
func BenchmarkWriterWrite(b *testing.B) {
	s := sampleSnapshot()
	w := NewWriter(io.Discard, WriterOptions{})
	line, _ := jsonLine(s)
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for range b.N {
		if err := w.Write(s); err != nil {
			b.Fatal(err)
		}
	}
}
