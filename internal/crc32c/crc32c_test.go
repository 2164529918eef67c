package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestCombineAndSuffix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 4, 7, 100, 4096, 1 << 20} {
		for _, m := range []int{0, 1, 5, 24, 1000, 3 << 20} {
			a, b := make([]byte, n), make([]byte, m)
			for i := range a {
				a[i] = byte(r.Uint32())
			}
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			ca, cb := crc32.Checksum(a, Table), crc32.Checksum(b, Table)
			cab := crc32.Update(ca, Table, b)
			if got := Combine(ca, cb, int64(m)); got != cab {
				t.Fatalf("Combine(%d, %d) = %#x, want %#x", n, m, got, cab)
			}
			if got := Suffix(cab, ca, int64(m)); got != cb {
				t.Fatalf("Suffix(%d, %d) = %#x, want %#x", n, m, got, cb)
			}
		}
	}
}

func TestLinearPatch(t *testing.T) {
	// A 4-byte field patched at byte 20 of a 1000-byte message after its CRC was taken.
	r := rand.New(rand.NewPCG(3, 4))
	msg := make([]byte, 1000)
	for i := range msg {
		msg[i] = byte(r.Uint32())
	}
	clear(msg[20:24])
	zeroed := crc32.Checksum(msg, Table)
	field := []byte{0xde, 0xad, 0xbe, 0xef}
	copy(msg[20:], field)
	if got, want := zeroed^Shift(Linear(field), int64(len(msg)-24)), crc32.Checksum(msg, Table); got != want {
		t.Fatalf("patched CRC %#x, want %#x", got, want)
	}
}
