// Package crc32c is the arithmetic of CRC32C (Castagnoli) values that lets a CRC of a
// concatenation be had from the CRCs of its pieces, without their bytes: what a multipart
// upload needs to name each part's CRC32C from CRCs the stream writer already computed.
//
// A CRC (with its pre- and post-inversion, as hash/crc32 computes it) is affine in the
// message: crc(A||B) = Shift(crc(A), len(B)) ^ crc(B), where Shift multiplies by
// x^(8·len(B)) modulo the polynomial (the same identity as zlib's crc32_combine; written
// here from the algebra, Go's standard library has no combine).
package crc32c

import "hash/crc32"

// poly is the Castagnoli polynomial, bit-reversed (hash/crc32's Castagnoli).
const poly = 0x82f63b78

// Table is hash/crc32's Castagnoli table.
var Table = crc32.MakeTable(crc32.Castagnoli)

// x2n[k] is x^(2^k) modulo the polynomial, in the reflected representation where 1<<31 is x^0.
var x2n [64]uint32

func init() {
	p := uint32(1) << 30 // x^1
	x2n[0] = p
	for k := 1; k < len(x2n); k++ {
		p = mulmod(p, p)
		x2n[k] = p
	}
}

// mulmod is a·b modulo the polynomial (reflected: bit 31 is the x^0 coefficient).
func mulmod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// xpow8 is x^(8·n) modulo the polynomial.
func xpow8(n int64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = mulmod(x2n[k&63], p)
		}
	}
	return p
}

// Shift is the linear part of appending n zero bytes to a message whose CRC-register
// value is c: Shift(crc(A), n) ^ crc(B) = crc(A||B) for any B of n bytes.
func Shift(c uint32, n int64) uint32 {
	if n <= 0 || c == 0 {
		return c
	}
	return mulmod(xpow8(n), c)
}

// Combine is crc(A||B) from crcA = crc(A), crcB = crc(B) and len(B).
func Combine(crcA, crcB uint32, lenB int64) uint32 { return Shift(crcA, lenB) ^ crcB }

// Suffix is crc(B) from crcAB = crc(A||B), crcA = crc(A) and len(B): the CRC of a range
// [a, b) of a file from the CRCs of its prefixes [0, a) and [0, b).
func Suffix(crcAB, crcA uint32, lenB int64) uint32 { return crcAB ^ Shift(crcA, lenB) }

// Linear is the linear part of the CRC of b (at most 8 bytes): crc(X ^ Y) = crc(X) ^ Linear(Y) for X and Y
// of the same length, where Y is b followed by any number of zero bytes shifted in with
// Shift. It is how bytes patched into a message after its CRC was computed (a header's own
// CRC field) are accounted for.
func Linear(b []byte) uint32 {
	var z [8]byte
	if len(b) > len(z) {
		panic("crc32c.Linear: more than 8 bytes")
	}
	return crc32.Update(0, Table, b) ^ crc32.Update(0, Table, z[:len(b)])
}
