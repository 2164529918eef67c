//go:build !(linux && amd64)

package bpf

// probes is absent on this platform; every collector uses its /proc fallback or is off.
type probes struct{ statsErr string }

func loadProbes(uint32) (*probes, map[string]error, error) { return nil, nil, ErrUnsupported }

func (p *probes) read(bool) (rawCounters, error)        { return rawCounters{}, nil }
func (p *probes) drainOpens(int) ([]DeviceOpen, uint64) { return nil, 0 }
func (p *probes) watch(uint32) error                    { return ErrUnsupported }
func (p *probes) unwatch(uint32) error                  { return nil }
func (p *probes) watchCgroup(uint64) error              { return ErrUnsupported }
func (p *probes) forgetProcess(uint32)                  {}
func (p *probes) forgetThread(uint32)                   {}
func (p *probes) sweepThreads(func(uint32) bool)        {}
func (p *probes) close() error                          { return nil }

func (p *probes) procTotals(uint32) (ProcessTotals, error) { return ProcessTotals{}, ErrUnsupported }

func (p *probes) setCPUNodes(map[int]int) error { return ErrUnsupported }
