package units

import (
	"math"
	"testing"
)

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float64
		want string
	}{
		{"zero", 0, "0B"},
		{"below a KiB", 1023, "1023B"},
		{"one KiB", 1024, "1.0KiB"},
		{"half", 512 << 10, "512.0KiB"},
		{"one and a half MiB", 3 << 19, "1.5MiB"},
		{"GiB", 1 << 30, "1.0GiB"},
		{"EiB", 1 << 60, "1.0EiB"},
		{"past EiB stays EiB", math.Ldexp(1, 70), "1024.0EiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Bytes(tc.in); got != tc.want {
				t.Fatalf("Bytes(%v) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
