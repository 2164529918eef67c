//go:build !amd64 || purego

package codec

import "github.com/strap-llm/strap/internal/dtype"

// The vector fp8 loops exist for amd64 only; elsewhere the scalar loops do it all.

var hasF16C = false

func fp8Vec(_, _ []byte, _ float32, _ float64, _ dtype.DType) (done int, ss, sse, ssd float64, mb uint64) {
	return 0, 0, 0, 0, 0
}

func fp8AbsMax32(_ []byte) (int, uint32) { return 0, 0 }

func fp8AbsMax16(_ []byte) (int, uint16) { return 0, 0 }
