package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/prometheus/procfs"
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

// ReadPSI reads every resource present under procRoot/pressure (procRoot is normally
// /proc) with procfs. It returns nil and no error when that directory does not exist
// (kernel without CONFIG_PSI, or psi=0); a file that exists but does not parse, or holds
// no "some" line or an average outside 0..100, is an error naming it. As procfs does,
// lines of an unknown kind are skipped (a later kernel may add some) and, should a kind
// appear twice, the last line wins.
func ReadPSI(procRoot string) (map[string]PSIResource, error) {
	if _, err := os.Stat(filepath.Join(procRoot, "pressure")); os.IsNotExist(err) {
		return nil, nil
	}
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, fmt.Errorf("pressure: %w", err)
	}
	out := make(map[string]PSIResource, len(PSIResources))
	for _, res := range PSIResources {
		r, err := readPSIResource(fs, res)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) {
			continue // resource absent, or PSI compiled in but disabled (psi=0)
		}
		if err != nil {
			return out, fmt.Errorf("pressure %s: %w", res, err)
		}
		out[res] = r
	}
	return out, nil
}

// readPSIResource reads /proc/pressure/<res>; a read error is returned as procfs wraps
// it, anything else wrong with the contents is ErrBadPSI.
func readPSIResource(fs procfs.FS, res string) (PSIResource, error) {
	st, err := fs.PSIStatsForResource(res)
	if errors.Is(err, procfs.ErrFileRead) {
		return PSIResource{}, err
	}
	if err != nil {
		return PSIResource{}, fmt.Errorf("%w: %v", ErrBadPSI, err)
	}
	if st.Some == nil {
		return PSIResource{}, fmt.Errorf("%w: no some line", ErrBadPSI)
	}
	var r PSIResource
	for _, l := range []struct {
		kind string
		src  *procfs.PSILine
		dst  **PSIValues
	}{{"some", st.Some, &r.Some}, {"full", st.Full, &r.Full}} {
		if l.src == nil {
			continue
		}
		for _, avg := range []float64{l.src.Avg10, l.src.Avg60, l.src.Avg300} {
			if !(avg >= 0 && avg <= 100) {
				return PSIResource{}, fmt.Errorf("%w: %s: average %v out of range 0..100", ErrBadPSI, l.kind, avg)
			}
		}
		*l.dst = &PSIValues{Avg10: l.src.Avg10, Avg60: l.src.Avg60, Avg300: l.src.Avg300, Total: l.src.Total}
	}
	return r, nil
}
