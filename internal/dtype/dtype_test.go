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
