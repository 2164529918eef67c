//go:build !purego

package codec

import "golang.org/x/sys/cpu"

// hasAVX2 selects the vector transposes; a variable so tests can run the portable ones.
var hasAVX2 = cpu.X86.HasAVX2

//go:noescape
func shuffle4AVX2(p0, p1, p2, p3, src *byte, blocks int, rot bool)

//go:noescape
func shuffle2AVX2(p0, p1, src *byte, blocks int, rot bool)

// shuffle4Vec transposes the leading multiple of 16 elements of src (4-byte elements,
// len(src) ≥ 4·len(p0), every plane ≥ len(p0)) and returns how many it did.
func shuffle4Vec(p0, p1, p2, p3, src []byte, rot bool) int {
	n := len(p0)
	b := n / 16
	if !hasAVX2 || b == 0 {
		return 0
	}
	_, _, _, _ = p1[n-1], p2[n-1], p3[n-1], src[4*n-1]
	shuffle4AVX2(&p0[0], &p1[0], &p2[0], &p3[0], &src[0], b, rot)
	return 16 * b
}

// shuffle2Vec is shuffle4Vec for 2-byte elements, 32 at a time.
func shuffle2Vec(p0, p1, src []byte, rot bool) int {
	n := len(p0)
	b := n / 32
	if !hasAVX2 || b == 0 {
		return 0
	}
	_, _ = p1[n-1], src[2*n-1]
	shuffle2AVX2(&p0[0], &p1[0], &src[0], b, rot)
	return 32 * b
}
