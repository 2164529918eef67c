package stream

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

// directDir is a directory whose file system takes O_DIRECT: the test temp dir, or else
// /var/tmp (TMPDIR is often tmpfs, which the Writer deliberately writes buffered).
func directDir(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{t.TempDir(), os.Getenv("STRAP_DIRECT_TEST_DIR"), "/var/tmp"} {
		if dir == "" {
			continue
		}
		f, err := os.CreateTemp(dir, "probe")
		if err != nil {
			continue
		}
		rc, _ := f.SyscallConn()
		why := directUnsupported(rc)
		f.Close()
		os.Remove(f.Name())
		if why == "" {
			if dir == t.TempDir() {
				return dir
			}
			d, err := os.MkdirTemp(dir, "strap-direct-test")
			if err != nil {
				continue
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	t.Skip("no directory on a file system with O_DIRECT (set STRAP_DIRECT_TEST_DIR)")
	return ""
}

// newDirect starts a direct stream on a new file in dir; the test fails if O_DIRECT is
// not taken there.
func newDirect(t *testing.T, dir string, meta any) (*Writer, *os.File) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "d.strap"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	w, err := NewWith(f, meta, WriterOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	if on, why := w.Direct(); !on {
		t.Fatalf("O_DIRECT not taken: %s", why)
	}
	return w, f
}

// mixedPackets is a stream that crosses every path of the direct writer: small packets,
// a payload that fills a staging buffer exactly, ones larger than a buffer (CRC before
// and after), compressed blocks, tokens and drops, at offsets with every alignment.
func mixedPackets(t *testing.T) []Packet {
	lz := mustCodec(t, "lz4")
	var ps []Packet
	seq := uint64(0)
	add := func(p Packet) {
		seq++
		p.Seq = seq
		ps = append(ps, p)
	}
	sizes := []int{4, 1000, 4093, 300 << 10, 4 << 20, dirBufSize - 96 - 1, 9 << 20, 17, 20 << 20, 3}
	for i, n := range sizes {
		raw := randomBytes(n, uint64(i))
		add(Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(n)}, RawLen: uint64(n), Step: uint64(i)},
			Name: "t", Blocks: []Block{{Data: raw[:n/2]}, {Data: raw[n/2:]}}, Shared: true})
		if i%3 == 1 {
			add(Packet{Header: Header{Type: TypeToken, Step: uint64(i)}, Meta: []byte(`{"position":1,"text":"a","token_id":2}`)})
		}
		if i%4 == 2 {
			add(Packet{Header: Header{Type: TypeDrop, RawLen: 64, TensorLen: 64, Step: uint64(i)}, Name: "d", Meta: []byte(`{"reason":"ring_full"}`)})
		}
	}
	for i, n := range []int{5000, 12 << 20} {
		raw := normalF32(n/4, 0.25, uint64(i))
		add(Packet{Header: Header{Type: TypeTensor, DType: dtype.Float32, Shape: []uint64{uint64(n / 4)}, Codec: codec.LZ4,
			RawLen: uint64(n), BlockSize: 1 << 20}, Name: "c", Blocks: blocksFor(t, lz, dtype.Float32, raw, 1<<20)})
	}
	return ps
}

// TestDirectMatchesBuffered: the O_DIRECT writer writes the same bytes as the buffered
// one, and after every Sync a reader of the live file sees exactly the stream so far (no
// padding, no hole).
func TestDirectMatchesBuffered(t *testing.T) {
	ps := mixedPackets(t)
	ref := tempFile(t)
	w, err := New(ref, map[string]any{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	writeAll(t, w, ps)
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, ref)

	d, f := newDirect(t, directDir(t), map[string]any{"k": "v"})
	for i := range ps {
		if err := d.WritePacket(&ps[i]); err != nil {
			t.Fatal(err)
		}
		if i%4 == 1 {
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(got)) != d.Offset() || !bytes.Equal(got, want[:len(got)]) {
				t.Fatalf("after packet %d and Sync: file holds %d bytes, stream offset %d, equal prefix: %v",
					i, len(got), d.Offset(), bytes.Equal(got, want[:min(len(got), len(want))]))
			}
		}
	}
	if err := d.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("direct stream (%d bytes) differs from the buffered one (%d bytes)", len(got), len(want))
	}
}

// TestDirectResume: a direct writer resumed at a checkpoint offset with any alignment
// (the last partial block is read back and written again) gives the uninterrupted stream.
func TestDirectResume(t *testing.T) {
	ps := mixedPackets(t)
	ref := tempFile(t)
	w, err := New(ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeAll(t, w, ps)
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, ref)
	dir := directDir(t)
	for _, at := range []int{1, 2, 5, 9, len(ps) - 1} {
		t.Run("", func(t *testing.T) {
			d, f := newDirect(t, dir, nil)
			writeAll(t, d, ps[:at])
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
			off, packets := d.Offset(), d.Packets()
			_, lastCRC := d.LastPacket()
			writeAll(t, d, ps[at:min(at+2, len(ps))]) // then the daemon dies without END
			_ = d.Sync()
			g, err := os.OpenFile(f.Name(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			w2, err := ResumeWith(g, ResumeExpect{AppendAt: off, LastSeq: ps[at-1].Seq, LastCRC: lastCRC, Packets: packets}, WriterOptions{Direct: true})
			if err != nil {
				t.Fatal(err)
			}
			if on, why := w2.Direct(); !on {
				t.Fatalf("resumed without O_DIRECT: %s", why)
			}
			writeAll(t, w2, ps[at:])
			if err := w2.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, g); !bytes.Equal(got, want) {
				t.Fatalf("resumed at %d (offset %d, %% 4096 = %d): %d bytes, want the uninterrupted %d", at, off, off%4096, len(got), len(want))
			}
		})
	}
}

// TestDirectSharedPayloadChanged: a shared payload rewritten while a direct writer
// stages it never leaves a packet whose CRC does not cover its bytes, and the rewriting is
// caught: ErrPayloadChanged, the packet gone (dropped from the staging buffer when it fits
// one, cut off the file when it is larger) and the stream writable after it.
func TestDirectSharedPayloadChanged(t *testing.T) {
	dir := directDir(t)
	for _, tc := range []struct {
		name  string
		size  int
		tries int // packets written at most until one is caught
	}{
		{"larger than a staging buffer", dirBufSize + 5<<20, 60},
		{"fits a staging buffer", 1 << 20, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := syscall.Mmap(-1, 0, tc.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Munmap(mem)
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					mem[(i*4099)%len(mem)]++
				}
			}()
			w, f := newDirect(t, dir, nil)
			seq, changed := uint64(0), 0
			small := randomBytes(777, 1)
			// The rewriter runs when the scheduler lets it (2 cores, other tests): keep
			// writing until it is caught in the act, then a few packets more.
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < tc.tries && (changed == 0 || i < 12) && time.Now().Before(deadline); i++ {
				seq++
				p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(mem))},
					Seq: seq, RawLen: uint64(len(mem))}, Name: "x", Blocks: []Block{{Data: mem}}, Shared: true}
				before := w.Offset()
				switch err := w.WritePacket(&p); {
				case errors.Is(err, ErrPayloadChanged):
					changed++
					seq--
					if w.Offset() != before {
						t.Fatalf("offset %d after a cut packet that started at %d", w.Offset(), before)
					}
				case err != nil:
					t.Fatal(err)
				}
				seq++ // an unaligned small packet after each, so cuts land mid-block
				sp := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{777}, Seq: seq, RawLen: 777},
					Name: "s", Blocks: []Block{{Data: small}}}
				if err := w.WritePacket(&sp); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			<-done
			if err := w.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			if changed == 0 {
				t.Fatalf("no packet caught changing while written (%d in the stream)", seq)
			}
			t.Logf("%d packets caught changing; %d packets in the stream", changed, seq)
			st, _ := f.Stat()
			if st.Size() != w.Offset() {
				t.Fatalf("file %d bytes, stream %d", st.Size(), w.Offset())
			}
			if rep := Verify(f, st.Size()); !rep.OK || rep.Tensors != seq {
				t.Fatalf("verify: %+v", rep)
			}
		})
	}
}

// TestDirectFallback: tmpfs and non-regular files are written buffered, and say why.
func TestDirectFallback(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	w, err := NewWith(null, nil, WriterOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	if on, why := w.Direct(); on || why == "" {
		t.Fatalf("/dev/null: Direct() = %v, %q", on, why)
	}
	if _, err := os.Stat("/dev/shm"); err == nil {
		f, err := os.CreateTemp("/dev/shm", "strap-direct-test")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f.Name())
		defer f.Close()
		rc, _ := f.SyscallConn()
		if directUnsupported(rc) == "" {
			t.Skip("/dev/shm is not tmpfs here")
		}
		w, err := NewWith(f, nil, WriterOptions{Direct: true})
		if err != nil {
			t.Fatal(err)
		}
		if on, why := w.Direct(); on || why == "" {
			t.Fatalf("tmpfs: Direct() = %v, %q", on, why)
		}
		writeAll(t, w, mixedPackets(t)[:4])
		if err := w.Close(EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
		if rep := Verify(f, w.Offset()); !rep.OK {
			t.Fatalf("verify: %+v", rep)
		}
	}
}
