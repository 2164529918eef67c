package codec

import (
	"encoding/binary"
	"math/bits"
)

// Byte-plane transposes for 2- and 4-byte elements, eight elements per step in 64-bit
// registers: the byte-at-a-time loops they replace spent as long on the transpose as huff0
// spent coding the planes.

const (
	m8   = 0x00FF00FF00FF00FF
	m16  = 0x0000FFFF0000FFFF
	lo32 = 0x00000000FFFFFFFF
	hi32 = 0xFFFFFFFF00000000
)

// rotl32x2 rotates both 32-bit lanes of x left by one bit.
func rotl32x2(x uint64) uint64 {
	return (x<<1)&0xFFFFFFFEFFFFFFFE | (x>>31)&0x0000000100000001
}

// rotr32x2 rotates both 32-bit lanes of x right by one bit.
func rotr32x2(x uint64) uint64 {
	return (x>>1)&0x7FFFFFFF7FFFFFFF | (x<<31)&0x8000000080000000
}

// rotl16x4 rotates the four 16-bit lanes of x left by one bit.
func rotl16x4(x uint64) uint64 {
	return (x<<1)&0xFFFEFFFEFFFEFFFE | (x>>15)&0x0001000100010001
}

// rotr16x4 rotates the four 16-bit lanes of x right by one bit.
func rotr16x4(x uint64) uint64 {
	return (x>>1)&0x7FFF7FFF7FFF7FFF | (x<<15)&0x8000800080008000
}

// shuffle4 writes byte j of element i of src (4-byte elements, rotated left one bit when
// rot) to planes[j][i]; every plane has len(src)/4 bytes.
func shuffle4(p0, p1, p2, p3, src []byte, rot bool) {
	n := len(p0)
	p1, p2, p3 = p1[:n], p2[:n], p3[:n]
	src = src[:4*n]
	// Reslicing instead of indexing lets the compiler drop the bounds checks in the loop.
	s, q0, q1, q2, q3 := src, p0, p1, p2, p3
	for len(s) >= 32 && len(q0) >= 8 && len(q1) >= 8 && len(q2) >= 8 && len(q3) >= 8 {
		in0 := binary.LittleEndian.Uint64(s[0:8])
		in1 := binary.LittleEndian.Uint64(s[8:16])
		in2 := binary.LittleEndian.Uint64(s[16:24])
		in3 := binary.LittleEndian.Uint64(s[24:32])
		if rot {
			in0, in1, in2, in3 = rotl32x2(in0), rotl32x2(in1), rotl32x2(in2), rotl32x2(in3)
		}
		// Pair element k with element k+4, so the two byte stages below leave every plane
		// in element order.
		w0 := in0&lo32 | in2<<32
		w1 := in0>>32 | in2&hi32
		w2 := in1&lo32 | in3<<32
		w3 := in1>>32 | in3&hi32
		x01 := w0&m8 | (w1&m8)<<8
		y01 := (w0>>8)&m8 | w1&^m8
		x23 := w2&m8 | (w3&m8)<<8
		y23 := (w2>>8)&m8 | w3&^m8
		binary.LittleEndian.PutUint64(q0[:8], x01&m16|(x23&m16)<<16)
		binary.LittleEndian.PutUint64(q1[:8], y01&m16|(y23&m16)<<16)
		binary.LittleEndian.PutUint64(q2[:8], (x01>>16)&m16|x23&^m16)
		binary.LittleEndian.PutUint64(q3[:8], (y01>>16)&m16|y23&^m16)
		s, q0, q1, q2, q3 = s[32:], q0[8:], q1[8:], q2[8:], q3[8:]
	}
	for i := n - len(q0); i < n; i++ {
		v := binary.LittleEndian.Uint32(src[4*i:])
		if rot {
			v = bits.RotateLeft32(v, 1)
		}
		p0[i], p1[i], p2[i], p3[i] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
}

// unshuffle4 is the inverse of shuffle4.
func unshuffle4(dst, p0, p1, p2, p3 []byte, rot bool) {
	n := len(p0)
	p1, p2, p3 = p1[:n], p2[:n], p3[:n]
	dst = dst[:4*n]
	d, r0, r1, r2, r3 := dst, p0, p1, p2, p3
	for len(d) >= 32 && len(r0) >= 8 && len(r1) >= 8 && len(r2) >= 8 && len(r3) >= 8 {
		q0 := binary.LittleEndian.Uint64(r0[:8])
		q1 := binary.LittleEndian.Uint64(r1[:8])
		q2 := binary.LittleEndian.Uint64(r2[:8])
		q3 := binary.LittleEndian.Uint64(r3[:8])
		x01 := q0&m16 | (q2&m16)<<16
		x23 := (q0>>16)&m16 | q2&^m16
		y01 := q1&m16 | (q3&m16)<<16
		y23 := (q1>>16)&m16 | q3&^m16
		w0 := x01&m8 | (y01&m8)<<8
		w1 := (x01>>8)&m8 | y01&^m8
		w2 := x23&m8 | (y23&m8)<<8
		w3 := (x23>>8)&m8 | y23&^m8
		in0 := w0&lo32 | w1<<32
		in2 := w0>>32 | w1&hi32
		in1 := w2&lo32 | w3<<32
		in3 := w2>>32 | w3&hi32
		if rot {
			in0, in1, in2, in3 = rotr32x2(in0), rotr32x2(in1), rotr32x2(in2), rotr32x2(in3)
		}
		binary.LittleEndian.PutUint64(d[0:8], in0)
		binary.LittleEndian.PutUint64(d[8:16], in1)
		binary.LittleEndian.PutUint64(d[16:24], in2)
		binary.LittleEndian.PutUint64(d[24:32], in3)
		d, r0, r1, r2, r3 = d[32:], r0[8:], r1[8:], r2[8:], r3[8:]
	}
	for i := n - len(r0); i < n; i++ {
		v := uint32(p0[i]) | uint32(p1[i])<<8 | uint32(p2[i])<<16 | uint32(p3[i])<<24
		if rot {
			v = bits.RotateLeft32(v, -1)
		}
		binary.LittleEndian.PutUint32(dst[4*i:], v)
	}
}

// evenBytes packs bytes 0, 2, 4 and 6 of x into the low 32 bits.
func evenBytes(x uint64) uint64 {
	x &= m8
	x = (x | x>>8) & m16
	return (x | x>>16) & lo32
}

// spreadBytes is the inverse of evenBytes: the low four bytes of x go to bytes 0, 2, 4, 6.
func spreadBytes(x uint64) uint64 {
	x = (x | x<<16) & m16
	return (x | x<<8) & m8
}

// shuffle2 is shuffle4 for 2-byte elements.
func shuffle2(p0, p1, src []byte, rot bool) {
	n := len(p0)
	p1 = p1[:n]
	src = src[:2*n]
	s, q0, q1 := src, p0, p1
	for len(s) >= 16 && len(q0) >= 8 && len(q1) >= 8 {
		in0 := binary.LittleEndian.Uint64(s[0:8])
		in1 := binary.LittleEndian.Uint64(s[8:16])
		if rot {
			in0, in1 = rotl16x4(in0), rotl16x4(in1)
		}
		binary.LittleEndian.PutUint64(q0[:8], evenBytes(in0)|evenBytes(in1)<<32)
		binary.LittleEndian.PutUint64(q1[:8], evenBytes(in0>>8)|evenBytes(in1>>8)<<32)
		s, q0, q1 = s[16:], q0[8:], q1[8:]
	}
	for i := n - len(q0); i < n; i++ {
		v := binary.LittleEndian.Uint16(src[2*i:])
		if rot {
			v = bits.RotateLeft16(v, 1)
		}
		p0[i], p1[i] = byte(v), byte(v>>8)
	}
}

// unshuffle2 is the inverse of shuffle2.
func unshuffle2(dst, p0, p1 []byte, rot bool) {
	n := len(p0)
	p1 = p1[:n]
	dst = dst[:2*n]
	d, r0, r1 := dst, p0, p1
	for len(d) >= 16 && len(r0) >= 8 && len(r1) >= 8 {
		q0 := binary.LittleEndian.Uint64(r0[:8])
		q1 := binary.LittleEndian.Uint64(r1[:8])
		in0 := spreadBytes(q0&lo32) | spreadBytes(q1&lo32)<<8
		in1 := spreadBytes(q0>>32) | spreadBytes(q1>>32)<<8
		if rot {
			in0, in1 = rotr16x4(in0), rotr16x4(in1)
		}
		binary.LittleEndian.PutUint64(d[0:8], in0)
		binary.LittleEndian.PutUint64(d[8:16], in1)
		d, r0, r1 = d[16:], r0[8:], r1[8:]
	}
	for i := n - len(r0); i < n; i++ {
		v := uint16(p0[i]) | uint16(p1[i])<<8
		if rot {
			v = bits.RotateLeft16(v, -1)
		}
		binary.LittleEndian.PutUint16(dst[2*i:], v)
	}
}
