package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/prometheus/procfs"

	"github.com/strap-llm/strap/internal/trace"
)

// ReadPSI reads every resource present under procRoot/pressure (procRoot is normally
// /proc) with procfs. It returns nil and no error when that directory does not exist
// (kernel without CONFIG_PSI, or psi=0); a file that exists but does not parse, or holds
// no "some" line or an average outside 0..100, is an error naming it. As procfs does,
// lines of an unknown kind are skipped (a later kernel may add some) and, should a kind
// appear twice, the last line wins.
func ReadPSI(procRoot string) (map[string]trace.PSIResource, error) {
	if _, err := os.Stat(filepath.Join(procRoot, "pressure")); os.IsNotExist(err) {
		return nil, nil
	}
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, fmt.Errorf("pressure: %w", err)
	}
	out := make(map[string]trace.PSIResource, len(trace.PSIResources))
	for _, res := range trace.PSIResources {
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
func readPSIResource(fs procfs.FS, res string) (trace.PSIResource, error) {
	st, err := fs.PSIStatsForResource(res)
	if errors.Is(err, procfs.ErrFileRead) {
		return trace.PSIResource{}, err
	}
	if err != nil {
		return trace.PSIResource{}, fmt.Errorf("%w: %v", ErrBadPSI, err)
	}
	if st.Some == nil {
		return trace.PSIResource{}, fmt.Errorf("%w: no some line", ErrBadPSI)
	}
	var r trace.PSIResource
	for _, l := range []struct {
		kind string
		src  *procfs.PSILine
		dst  **trace.PSIValues
	}{{"some", st.Some, &r.Some}, {"full", st.Full, &r.Full}} {
		if l.src == nil {
			continue
		}
		for _, avg := range []float64{l.src.Avg10, l.src.Avg60, l.src.Avg300} {
			if !(avg >= 0 && avg <= 100) {
				return trace.PSIResource{}, fmt.Errorf("%w: %s: average %v out of range 0..100", ErrBadPSI, l.kind, avg)
			}
		}
		*l.dst = &trace.PSIValues{Avg10: l.src.Avg10, Avg60: l.src.Avg60, Avg300: l.src.Avg300, Total: l.src.Total}
	}
	return r, nil
}
