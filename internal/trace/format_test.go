package trace

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/trace")

const testdataDir = "../../testdata/trace"

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join(testdataDir, name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the golden file:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// sampleSnapshot fills every field with fixed values: the schema golden.
func sampleSnapshot() Snapshot {
	s := Snapshot{
		Sessions: []Session{{ID: "s-1", Output: "/captures/run1.strap", PID: 4242}},
		Watched:  []int{4242, 4300},
		LatencyHistogram: []DeviceHistogram{{DeviceName: "vda", Device: "254:0", Total: 3, Buckets: []Bucket{
			{Slot: 7, Count: 2, BucketLow: 64, BucketHigh: 127}, {Slot: 10, Count: 1, BucketLow: 512, BucketHigh: 1023}}}},
		Inflight: []DeviceCount{{DeviceName: "vda", Count: 0}},
		BlockIO: []DeviceIO{{DeviceName: "vda", ReadIOs: 1, WriteIOs: 2, ReadBytes: 4096, WriteBytes: 131072,
			ReadIOPS: 0.2, WriteIOPS: 0.4}},
		OffCPUNs:         map[string]uint64{"4242": 301000000},
		OffCPU:           map[string]OffCPU{"4242": {RunnableNs: 1000000, SleepNs: 300000000, IONs: 0, BlockedNs: 300000000}},
		PageFaults:       map[string]uint64{"4242": 5604},
		PageFaultsDetail: map[string]PageFaults{"4242": {User: 5604, Minor: 5590, Major: 14, Source: SourceBPF}},
		Syscalls: map[string]Syscalls{"4242": {MmapCount: 3, MmapBytes: 7352320, MlockCount: 2, MlockBytes: 4194304,
			MunlockCount: 1, MunlockBytes: 2097152, OpenatCount: 5, OpenatFailed: 1, NvidiaOpens: 2}},
		DeviceOpens: []DeviceOpen{{PID: 4242, TID: 4243, Path: "/dev/nvidia0", Ret: 7}, {PID: 4242, TID: 4243, Path: "/dev/nvidia-uvm", Ret: -2}},
		Sched:       map[string]Sched{"4242": {Voluntary: 12, Involuntary: 3, Migrations: 1, Source: SourceBPF}},
		Threads: []Thread{{TID: 4243, PID: 4242, OffCPU: OffCPU{RunnableNs: 1000000, SleepNs: 300000000, BlockedNs: 300000000},
			Voluntary: 12, Involuntary: 3, Migrations: 1}},
		SyscallLatency: map[string]map[string]LatencyStats{"4242": {
			"futex": {Count: 4, Errors: 1, Timed: 4, TotalNs: 200000000, Buckets: []Bucket{{Slot: 16, Count: 4, BucketLow: 32768, BucketHigh: 65535}}},
			"read":  {Count: 100, Timed: 10, TotalNs: 30000, Buckets: []Bucket{{Slot: 2, Count: 10, BucketLow: 2, BucketHigh: 3}}},
		}},
		SyncWait: map[string]map[string]LatencyStats{"4242": {
			"futex": {Count: 3, Errors: 1, Timed: 3, TotalNs: 150000000, Buckets: []Bucket{{Slot: 16, Count: 3, BucketLow: 32768, BucketHigh: 65535}}},
		}},
		RunqueueLatency: map[string]LatencyStats{"4242": {Count: 7, Timed: 7, TotalNs: 21000000, Buckets: []Bucket{{Slot: 12, Count: 7, BucketLow: 2048, BucketHigh: 4095}}}},
		NvidiaIoctl:     map[string]LatencyStats{"4242": {Count: 2, Errors: 2, Timed: 2, TotalNs: 4000, Buckets: []Bucket{{Slot: 2, Count: 2, BucketLow: 2, BucketHigh: 3}}}},
		TCP:             map[string]TCP{"4242": {TxBytes: 1048576, RxBytes: 524288, TxCalls: 16, RxCalls: 40, Retransmits: 1}},
		Memory:          map[string]Memory{"4242": {RSSBytes: 1073741824, RSSPeakBytes: 2147483648}},
		Pressure: map[string]PSIResource{
			"cpu":    {Some: &PSIValues{Avg10: 1.5, Avg60: 0.75, Avg300: 0.25, Total: 123456}, Full: &PSIValues{}},
			"io":     {Some: &PSIValues{Avg10: 0.1, Total: 42}, Full: &PSIValues{Avg10: 0.05, Total: 21}},
			"memory": {Some: &PSIValues{}, Full: &PSIValues{}},
		},
		Collectors: map[string]string{CollectorBlockIO: SourceBPF, CollectorOffCPU: SourceBPF, CollectorSched: SourceBPF,
			CollectorPageFaults: SourceBPF, CollectorSyscalls: SourceBPF, CollectorPressure: SourceProc},
		BPFStats: []ProgStats{{Program: "sched_switch", Events: 1000, RunTimeNs: 212000, NsPerEvent: 212,
			TotalEvents: 5000, TotalRunTimeNs: 1060000}},
		Drops: map[string]uint64{"ringbuf_full": 1},
	}
	for _, c := range []string{CollectorSyscallLatency, CollectorSyncWait, CollectorRunqueue, CollectorNvidiaIoctl, CollectorTCP} {
		s.Collectors[c] = SourceBPF
	}
	s.Collectors[CollectorMemory] = SourceProc
	s.Stamp(time.Date(2026, 11, 25, 21, 0, 5, 123456000, time.UTC), 5*time.Second)
	return s
}

// TestSnapshotSchemaGolden pins the JSON line (field names, order, encoding) to
// testdata/trace/snapshot.golden.jsonl and checks that it reads back identically.
func TestSnapshotSchemaGolden(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WriterOptions{})
	empty := NewSnapshot()
	empty.Stamp(time.Date(2026, 11, 25, 21, 0, 0, 0, time.UTC), 0)
	for _, s := range []Snapshot{sampleSnapshot(), empty} {
		if err := w.Write(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	golden(t, "snapshot.golden.jsonl", buf.Bytes())
	got, err := ReadSnapshots(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !reflect.DeepEqual(got[0], sampleSnapshot()) {
		t.Fatalf("read back %d snapshots; first:\n%+v\nwant:\n%+v", len(got), got[0], sampleSnapshot())
	}
	// The original trace's field names are all present in a line.
	for _, k := range []string{"timestamp", "iso_timestamp", "interval_s", "latency_histogram", "device_name", "total",
		"buckets", "slot", "count", "bucket_low", "bucket_high", "inflight", "off_cpu_ns", "page_faults", "pressure",
		"some", "full", "avg10", "avg60", "avg300", "sessions"} {
		if !bytes.Contains(buf.Bytes(), []byte(`"`+k+`":`)) {
			t.Errorf("field %q missing", k)
		}
	}
}

func TestReadSnapshotsTorn(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WriterOptions{FlushEvery: 3})
	for range 3 {
		if err := w.Write(sampleSnapshot()); err != nil {
			t.Fatal(err)
		}
	}
	data := buf.Bytes()
	for _, tc := range []struct {
		name  string
		input []byte
		n     int
		torn  bool
	}{
		{"whole", data, 3, false},
		{"cut mid-line", data[:len(data)-100], 2, true},
		{"cut at newline", data[:bytes.IndexByte(data, '\n')+1], 1, false},
		{"empty", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadSnapshots(bytes.NewReader(tc.input))
			if len(got) != tc.n || errors.Is(err, ErrTornLine) != tc.torn || (err != nil && !tc.torn) {
				t.Fatalf("got %d snapshots, err %v; want %d, torn %v", len(got), err, tc.n, tc.torn)
			}
		})
	}
}

// TestRepairFile covers what a crash can leave at the end of a trace file.
func TestRepairFile(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WriterOptions{})
	for range 2 {
		if err := w.Write(sampleSnapshot()); err != nil {
			t.Fatal(err)
		}
	}
	whole := buf.Bytes()
	line := whole[:bytes.IndexByte(whole, '\n')+1]
	for _, tc := range []struct {
		name    string
		content []byte
		keep    int // bytes left after repair
		wantErr error
	}{
		{"whole lines", whole, len(whole), nil},
		{"torn last line", whole[:len(whole)-57], len(line), nil},
		{"zero-filled tail", append(clone(whole), make([]byte, 4096)...), len(whole), nil},
		{"zeros then newline", append(append(clone(line), make([]byte, 100)...), '\n'), len(line), nil},
		{"only a torn first line", line[:40], 0, nil},
		{"empty", nil, 0, nil},
		{"not a trace", []byte("hello world\nthis is my thesis"), -1, ErrNotTrace},
		{"not a trace, last line bad", []byte("hello\nworld\n"), -1, ErrNotTrace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "jsonl")
			if err := os.WriteFile(path, tc.content, 0o644); err != nil {
				t.Fatal(err)
			}
			w, cut, err := OpenFile(path, WriterOptions{})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if b, _ := os.ReadFile(path); !bytes.Equal(b, tc.content) {
					t.Fatal("refused file was modified")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cut != int64(len(tc.content)-tc.keep) {
				t.Errorf("cut %d bytes, want %d", cut, len(tc.content)-tc.keep)
			}
			if err := w.Write(sampleSnapshot()); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ReadSnapshots(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("after repair and append: %v", err)
			}
			if want := tc.keep/len(line) + 1; len(got) != want {
				t.Fatalf("%d snapshots after repair and append, want %d", len(got), want)
			}
			if bytes.IndexByte(b, 0) >= 0 {
				t.Fatal("NUL bytes left in the repaired file")
			}
		})
	}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func TestFormatText(t *testing.T) {
	var b strings.Builder
	if err := FormatText(&b, sampleSnapshot()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vda", "pid 4242", "sleep 300ms", "/dev/nvidia0", "pressure cpu", "sched_switch 1000×212ns", "DROPPED ringbuf_full: 1",
		"rss 1.0GiB (peak 2.0GiB)", "tcp tx 1.0MiB rx 512.0KiB retrans 1", "runq 7× mean 3ms max<4.096ms",
		"nvidia ioctl 2× (2 failed) mean 2µs max<4µs", "waits  futex 3× (1 failed) mean 50ms max<65.536ms",
		"syscalls  futex 4× (1 failed) mean 50ms max<65.536ms  read 100× mean 3µs max<4µs"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, b.String())
		}
	}
}
