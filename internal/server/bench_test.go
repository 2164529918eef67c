package server

import (
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/control/controltest"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/pipeline/pipelinetest"
	"github.com/strap-llm/strap/internal/shm"
)

// BenchmarkCapture measures the whole daemon path: Go producer → ring → PUBLISH over the
// socket → parse → compress on the pool → write → RELEASE, 4 MiB float32 tensors into a
// 64 MiB ring (policy block).
func BenchmarkCapture(b *testing.B) {
	const elems = 1 << 20
	for _, cd := range []string{"none", "lz4", "zstd", "shuffle"} {
		b.Run(cd, func(b *testing.B) {
			ts := startServer(b, Config{Workers: 0})
			c := ts.dial(b)
			out := outFile(b)
			st, _, err := controltest.OpenStream(c, shm.HeaderSize+64<<20, out, control.Open{Codec: cd, Policy: "block"})
			if err != nil {
				b.Fatal(err)
			}
			tn := shm.Tensor{Name: "model.layers.0.mlp", DType: dtype.Float32, Shape: []uint64{elems},
				Payload: pipelinetest.Activations(1, elems)}
			b.ReportAllocs()
			b.SetBytes(int64(len(tn.Payload)))
			b.ResetTimer()
			for range b.N {
				if err := st.Put(&tn); err != nil {
					b.Fatal(err)
				}
			}
			cl, err := st.Finish()
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if cl.Packets != uint64(b.N) {
				b.Fatalf("%d packets, want %d", cl.Packets, b.N)
			}
			b.ReportMetric(float64(cl.BytesIn)/float64(cl.FileBytes), "ratio")
		})
	}
}
