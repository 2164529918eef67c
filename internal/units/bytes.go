package units

import "fmt"

// Bytes renders v bytes with binary prefixes and one decimal: 512B, 1.5KiB, 2.0GiB. Values
// below 1 KiB are whole bytes.
func Bytes(v float64) string {
	const unit = 1024
	if v < unit {
		return fmt.Sprintf("%.0fB", v)
	}
	div, exp := float64(unit), 0
	for n := v / unit; n >= unit && exp < len(prefixes)-1; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", v/div, prefixes[exp])
}

// prefixes are the binary prefixes from kibi up; the largest absorbs anything bigger.
const prefixes = "KMGTPE"
