package dtype

import "testing"

func TestTable(t *testing.T) {
	tests := []struct {
		d     DType
		name  string
		size  int
		float bool
	}{
		{Float32, "float32", 4, true},
		{Float16, "float16", 2, true},
		{BFloat16, "bfloat16", 2, true},
		{Float64, "float64", 8, true},
		{Int8, "int8", 1, false},
		{Uint8, "uint8", 1, false},
		{Int16, "int16", 2, false},
		{Int32, "int32", 4, false},
		{Int64, "int64", 8, false},
		{Bool, "bool", 1, false},
		{Float8E4M3, "float8_e4m3fn", 1, true},
		{Float8E5M2, "float8_e5m2", 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.d.Valid() || tt.d.Size() != tt.size || tt.d.String() != tt.name || tt.d.IsFloat() != tt.float {
				t.Fatalf("%d: valid=%v size=%d name=%q float=%v", tt.d, tt.d.Valid(), tt.d.Size(), tt.d.String(), tt.d.IsFloat())
			}
			back, err := Parse(tt.name)
			if err != nil || back != tt.d {
				t.Fatalf("Parse(%q) = %v, %v", tt.name, back, err)
			}
		})
	}
}

func TestInvalid(t *testing.T) {
	for _, d := range []DType{Invalid, 13, 255} {
		if d.Valid() || d.Size() != 0 || d.IsFloat() {
			t.Errorf("%d reported as valid", d)
		}
		if d.String() == "" {
			t.Errorf("%d has no name", d)
		}
	}
	if _, err := Parse("complex64"); err == nil {
		t.Error("Parse accepted an unknown name")
	}
}

func TestFloat16RoundTrip(t *testing.T) {
	// Every fp16 bit pattern widens exactly and narrows back to itself (NaNs stay NaN).
	for h := 0; h < 1<<16; h++ {
		f := Float16ToFloat32(uint16(h))
		back := Float32ToFloat16(f)
		isNaN := h&0x7c00 == 0x7c00 && h&0x3ff != 0
		if isNaN {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, back)
		}
	}
	// Round to nearest even between 1 and the next fp16 (1 + 2^-10).
	if got := Float32ToFloat16(1 + 1.0/2048); got != 0x3c00 {
		t.Errorf("tie rounded to %#04x, want 0x3c00 (even)", got)
	}
	if got := Float32ToFloat16(70000); got != 0x7c00 {
		t.Errorf("overflow gave %#04x, want +inf", got)
	}
}

func TestBFloat16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BFloat16ToFloat32(uint16(h))
		if f != f { // NaN: Float32ToBFloat16 is never fed NaN
			continue
		}
		if back := Float32ToBFloat16(f); back != uint16(h) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, back)
		}
	}
}
