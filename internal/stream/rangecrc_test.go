package stream

import (
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/dtype"
)

// checkRangeCRCs compares every value the record holds with the CRC32C of the file's bytes
// read back, and requires one at every grain multiple and at the end.
func checkRangeCRCs(t *testing.T, r *RangeCRCs, file []byte, grain int64) {
	t.Helper()
	if r == nil {
		t.Fatal("no RangeCRCs")
	}
	size := int64(len(file))
	var want uint32 // CRC of file[:off], carried along
	prev := int64(0)
	check := func(off int64) {
		want = crc32.Update(want, castagnoli, file[prev:off])
		prev = off
		got, ok := r.At(off)
		if !ok {
			t.Fatalf("no CRC recorded at %d (grain %d, file %d bytes)", off, grain, size)
		}
		if got != want {
			t.Fatalf("CRC of [0, %d) recorded %#08x, the file's bytes have %#08x", off, got, want)
		}
	}
	for off := int64(0); off < size; off += grain {
		check(off)
	}
	check(size)
	if _, ok := r.At(size + 1); ok {
		t.Fatal("a CRC past the end of the file")
	}
	if size > grain+1 && grain > 1 {
		if _, ok := r.At(grain + 1); ok {
			t.Fatal("a CRC at an offset that is neither a grain multiple nor the end")
		}
	}
}

// TestRangeCRCsMatchFile: with every packet kind and size (small, filling a staging
// buffer, larger than one, compressed, DROP, TOKEN, then END, INDEX and footer), buffered
// and O_DIRECT, and grains that cut packets anywhere (in headers, in the CRC field), the
// recorded CRCs are those of the bytes on disk.
func TestRangeCRCsMatchFile(t *testing.T) {
	ps := mixedPackets(t)
	for _, grain := range []int64{5 << 20, 1<<20 + 13, 4096} {
		for _, direct := range []bool{false, true} {
			var f *os.File
			var err error
			if direct {
				f, err = os.OpenFile(filepath.Join(directDir(t), "r.strap"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
			} else {
				f = tempFile(t)
			}
			if err != nil {
				t.Fatal(err)
			}
			w, err := NewWith(f, map[string]any{"k": "v"}, WriterOptions{Direct: direct, CRCGrain: grain})
			if err != nil {
				t.Fatal(err)
			}
			if on, _ := w.Direct(); on != direct {
				t.Fatalf("direct %v asked, %v taken", direct, on)
			}
			for i := range ps {
				if err := w.WritePacket(&ps[i]); err != nil {
					t.Fatal(err)
				}
				if i%5 == 2 {
					if err := w.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := w.Close(EndInfo{Status: "complete"}); err != nil {
				t.Fatal(err)
			}
			checkRangeCRCs(t, w.RangeCRCs(), readAll(t, f), grain)
			f.Close()
		}
	}
}

// TestRangeCRCsTinyGrain: a grain of a few bytes puts boundaries at every byte position of
// packet headers, CRC fields included.
func TestRangeCRCsTinyGrain(t *testing.T) {
	for _, grain := range []int64{1, 7, 21, 23} {
		f := tempFile(t)
		w, err := NewWith(f, nil, WriterOptions{CRCGrain: grain})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 6; i++ {
			n := 1 + i*37
			p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(n)}, RawLen: uint64(n), Seq: uint64(i + 1)},
				Name: "t", Blocks: []Block{{Data: randomBytes(n, uint64(i))}}}
			if err := w.WritePacket(&p); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
		checkRangeCRCs(t, w.RangeCRCs(), readAll(t, f), grain)
	}
	var none *RangeCRCs // a stream without a grain
	if _, ok := none.At(0); ok {
		t.Fatal("a nil record answers")
	}
}

// TestRangeCRCsPayloadChanged: packets cut off the file because the client rewrote their
// ring bytes leave no trace in the record (O_DIRECT, larger than a staging buffer and not).
func TestRangeCRCsPayloadChanged(t *testing.T) {
	dir := directDir(t)
	for _, size := range []int{dirBufSize + 5<<20, 1 << 20} {
		mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
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
		f, err := os.OpenFile(filepath.Join(dir, "c.strap"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		const grain = 1<<20 + 4097
		w, err := NewWith(f, nil, WriterOptions{Direct: true, CRCGrain: grain})
		if err != nil {
			t.Fatal(err)
		}
		seq, changed := uint64(0), 0
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; i < 400 && (changed == 0 || i < 12) && time.Now().Before(deadline); i++ {
			seq++
			p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(len(mem))},
				Seq: seq, RawLen: uint64(len(mem))}, Name: "x", Blocks: []Block{{Data: mem}}, Shared: true}
			if err := w.WritePacket(&p); errors.Is(err, ErrPayloadChanged) {
				changed++
				seq--
			} else if err != nil {
				t.Fatal(err)
			}
			seq++
			sp := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{777}, Seq: seq, RawLen: 777},
				Name: "s", Blocks: []Block{{Data: randomBytes(777, seq)}}}
			if err := w.WritePacket(&sp); err != nil {
				t.Fatal(err)
			}
		}
		close(stop)
		<-done
		if err := w.Close(EndInfo{Status: "complete"}); err != nil {
			t.Fatal(err)
		}
		syscall.Munmap(mem)
		if changed == 0 {
			t.Fatalf("no packet caught changing (size %d)", size)
		}
		checkRangeCRCs(t, w.RangeCRCs(), readAll(t, f), grain)
		f.Close()
	}
}

// TestRangeCRCsForget: values before the offset given are dropped, the rest kept.
func TestRangeCRCsForget(t *testing.T) {
	f := tempFile(t)
	w, err := NewWith(f, nil, WriterOptions{CRCGrain: 100})
	if err != nil {
		t.Fatal(err)
	}
	p := Packet{Header: Header{Type: TypeTensor, DType: dtype.Uint8, Shape: []uint64{1000}, RawLen: 1000, Seq: 1},
		Name: "t", Blocks: []Block{{Data: randomBytes(1000, 1)}}}
	if err := w.WritePacket(&p); err != nil {
		t.Fatal(err)
	}
	r := w.RangeCRCs()
	r.Forget(500)
	if _, ok := r.At(400); ok {
		t.Fatal("a value before 500 kept")
	}
	if err := w.Close(EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	file := readAll(t, f)
	for _, off := range []int64{500, 900, int64(len(file))} {
		if c, ok := r.At(off); !ok || c != crc32.Checksum(file[:off], castagnoli) {
			t.Fatalf("at %d: %#x %v", off, c, ok)
		}
	}
}
