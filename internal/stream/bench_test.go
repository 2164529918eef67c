package stream

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

// BenchmarkWritePacket measures the write path alone: blocks are encoded once up front, as
// the pipeline's workers would hand them over. Bytes are raw tensor bytes.
func BenchmarkWritePacket(b *testing.B) {
	const tensor = 4 << 20
	raw := normalF32(tensor/4, 0.25, 1)
	for _, dst := range []string{"tempfile", "devnull"} {
		// none-shared: codec none straight from shared memory, as the pipeline writes from the
		// ring: the CRC is checked again after the writev.
		for _, name := range []string{"none", "none-shared", "lz4", "zstd"} {
			for _, size := range []int{64 << 10, tensor} {
				b.Run(fmt.Sprintf("%s/%s/%dKiB", dst, name, size>>10), func(b *testing.B) {
					c := mustCodec(b, strings.TrimSuffix(name, "-shared"))
					bs := 1 << 20
					blocks := blocksFor(b, c, dtype.Float32, raw[:size], bs)
					var f *os.File
					var err error
					if dst == "devnull" {
						f, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0)
						if err != nil {
							b.Skip(err)
						}
						defer f.Close()
					} else {
						f = tempFile(b)
					}
					w, err := New(f, nil)
					if err != nil {
						b.Fatal(err)
					}
					p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{uint64(size / 4)}, Codec: c.ID(), RawLen: uint64(size)}, Name: "model.layers.0.mlp", Blocks: blocks, Shared: strings.HasSuffix(name, "-shared")}
					if c.ID() != codec.None {
						p.BlockSize = uint32(bs)
					}
					b.ReportAllocs()
					b.SetBytes(int64(size))
					var seq uint64
					for b.Loop() {
						seq++
						p.Seq = seq
						if err := w.WritePacket(&p); err != nil {
							b.Fatal(err)
						}
						if dst == "tempfile" && w.Offset() > 1<<30 {
							b.StopTimer()
							if err := f.Truncate(0); err != nil {
								b.Fatal(err)
							}
							w, _ = New(f, nil)
							b.StartTimer()
						}
					}
					if err := w.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}
