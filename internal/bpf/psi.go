package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// PSIValues is one line of /proc/pressure/<resource>: the share of wall time (percent)
// that some (or all, for "full") non-idle tasks were stalled on the resource, averaged
// over 10 s, 60 s and 300 s, and the cumulative stall time in microseconds.
type PSIValues struct {
	Avg10  float64 `json:"avg10"`
	Avg60  float64 `json:"avg60"`
	Avg300 float64 `json:"avg300"`
	Total  uint64  `json:"total"`
}

// PSIResource holds the "some" and "full" lines of one resource; Full is nil where the
// kernel prints no full line (cpu before 5.13).
type PSIResource struct {
	Some *PSIValues `json:"some,omitempty"`
	Full *PSIValues `json:"full,omitempty"`
}

// PSIResources are the files read under /proc/pressure, in output order.
var PSIResources = []string{"cpu", "io", "memory"}

// ParsePSI parses the contents of one /proc/pressure file. Unknown keys on a line are
// ignored (the kernel may add some); missing avg/total keys, unknown line kinds,
// duplicate lines and bad numbers are errors.
func ParsePSI(b []byte) (PSIResource, error) {
	var r PSIResource
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) == 0 || (len(lines) == 1 && len(lines[0]) == 0) {
		return r, fmt.Errorf("%w: empty", ErrBadPSI)
	}
	for i, line := range lines {
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			return r, fmt.Errorf("%w: line %d empty", ErrBadPSI, i+1)
		}
		var dst **PSIValues
		switch string(fields[0]) {
		case "some":
			dst = &r.Some
		case "full":
			dst = &r.Full
		default:
			return r, fmt.Errorf("%w: line %d: unknown kind %q", ErrBadPSI, i+1, fields[0])
		}
		if *dst != nil {
			return r, fmt.Errorf("%w: line %d: duplicate %s", ErrBadPSI, i+1, fields[0])
		}
		var v PSIValues
		var seen int
		for _, f := range fields[1:] {
			k, val, ok := bytes.Cut(f, []byte("="))
			if !ok {
				return r, fmt.Errorf("%w: line %d: field %q has no '='", ErrBadPSI, i+1, f)
			}
			var err error
			switch string(k) {
			case "avg10":
				v.Avg10, err = parsePercent(val)
				seen |= 1
			case "avg60":
				v.Avg60, err = parsePercent(val)
				seen |= 2
			case "avg300":
				v.Avg300, err = parsePercent(val)
				seen |= 4
			case "total":
				v.Total, err = strconv.ParseUint(string(val), 10, 64)
				seen |= 8
			}
			if err != nil {
				return r, fmt.Errorf("%w: line %d: %s: %v", ErrBadPSI, i+1, k, err)
			}
		}
		if seen != 15 {
			return r, fmt.Errorf("%w: line %d: missing avg10/avg60/avg300/total", ErrBadPSI, i+1)
		}
		*dst = &v
	}
	if r.Some == nil {
		return r, fmt.Errorf("%w: no some line", ErrBadPSI)
	}
	return r, nil
}

func parsePercent(b []byte) (float64, error) {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, err
	}
	if f < 0 || f > 100 || f != f {
		return 0, fmt.Errorf("%v out of range 0..100", f)
	}
	return f, nil
}

// ReadPSI reads every resource present under dir (normally /proc/pressure). It returns
// nil and no error when dir does not exist (kernel without CONFIG_PSI or psi=0); a file
// that exists but does not parse is an error naming it.
func ReadPSI(dir string) (map[string]PSIResource, error) {
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil, nil
	}
	out := make(map[string]PSIResource, len(PSIResources))
	for _, res := range PSIResources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if os.IsNotExist(err) || errors.Is(err, syscall.EOPNOTSUPP) {
			continue // resource absent, or PSI compiled in but disabled (psi=0)
		}
		if err != nil {
			return out, fmt.Errorf("read pressure %s: %w", res, err)
		}
		r, err := ParsePSI(b)
		if err != nil {
			return out, fmt.Errorf("pressure %s: %w", res, err)
		}
		out[res] = r
	}
	return out, nil
}
