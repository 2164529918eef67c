// Package dtype owns the table of tensor element types shared by the ring protocol and the
// stream format (docs/STREAM_FORMAT.md section 4).
package dtype

import "fmt"

// DType is a tensor element type as numbered on the wire and on disk.
type DType uint8

// Element types; the numbers are part of the protocol and the stream format.
const (
	Invalid    DType = 0
	Float32    DType = 1
	Float16    DType = 2
	BFloat16   DType = 3
	Float64    DType = 4
	Int8       DType = 5
	Uint8      DType = 6
	Int16      DType = 7
	Int32      DType = 8
	Int64      DType = 9
	Bool       DType = 10
	Float8E4M3 DType = 11
	Float8E5M2 DType = 12
)

var table = [...]struct {
	name string
	size int
}{
	Invalid:    {"invalid", 0},
	Float32:    {"float32", 4},
	Float16:    {"float16", 2},
	BFloat16:   {"bfloat16", 2},
	Float64:    {"float64", 8},
	Int8:       {"int8", 1},
	Uint8:      {"uint8", 1},
	Int16:      {"int16", 2},
	Int32:      {"int32", 4},
	Int64:      {"int64", 8},
	Bool:       {"bool", 1},
	Float8E4M3: {"float8_e4m3fn", 1},
	Float8E5M2: {"float8_e5m2", 1},
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d != Invalid && int(d) < len(table) }

// Size is the element size in bytes (0 for an unknown type).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return table[d].size
}

// String is the lowercase name used in docs, JSON output and the Python client.
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return table[d].name
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	switch d {
	case Float32, Float16, BFloat16, Float64, Float8E4M3, Float8E5M2:
		return true
	}
	return false
}

// Parse maps a name from String back to its DType.
func Parse(name string) (DType, error) {
	for i := 1; i < len(table); i++ {
		if table[i].name == name {
			return DType(i), nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q", name)
}
