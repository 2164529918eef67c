package upload_test

import (
	"bytes"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/stream"
	"github.com/strap-llm/strap/internal/upload"
	"github.com/strap-llm/strap/internal/upload/uploadtest"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeStreamFile writes a finished stream of packets of varied sizes (about total bytes)
// and returns its bytes.
func writeStreamFile(t testing.TB, path string, total int) []byte {
	t.Helper()
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sw, err := stream.New(w, map[string]any{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; sw.Offset() < int64(total); i++ {
		n := 1 + (i*7919)%(300<<10)
		p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: dtype.Uint8, Shape: []uint64{uint64(n)},
			RawLen: uint64(n), Seq: uint64(i + 1)}, Name: "t", Blocks: []stream.Block{{Data: randomBytes(n, uint64(i))}}}
		if err := sw.WritePacket(&p); err != nil {
			t.Fatal(err)
		}
	}
	if err := sw.Close(stream.EndInfo{Status: "complete"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The record built from a finished stream's packet CRCs answers the CRC32C of the file's
// bytes up to every part boundary and the end (boundaries inside packets, on packet starts,
// in the footer), nothing elsewhere; a torn file is covered up to its last whole packet.
func TestStreamCRCsMatchTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.strap")
	data := writeStreamFile(t, path, 3<<20)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, grain := range []int64{64 << 10, 100003, 1 << 20, int64(len(data)) - 5} {
		s, err := upload.NewStreamCRCs(f, int64(len(data)), grain)
		if err != nil {
			t.Fatal(err)
		}
		if s.Covered() != int64(len(data)) {
			t.Fatalf("grain %d: covers %d of %d bytes", grain, s.Covered(), len(data))
		}
		for k := 0; k < 2; k++ { // the second time from what the first noted
			for off := int64(0); off < int64(len(data)); off += grain {
				got, ok := s.At(off)
				if want := crc32.Checksum(data[:off], castagnoli); !ok || got != want {
					t.Fatalf("grain %d: At(%d) = %08x, %v; want %08x", grain, off, got, ok, want)
				}
			}
		}
		if got, ok := s.At(int64(len(data))); !ok || got != crc32.Checksum(data, castagnoli) {
			t.Fatalf("grain %d: the end: %08x, %v", grain, got, ok)
		}
		if _, ok := s.At(grain + 1); ok {
			t.Fatalf("grain %d: an offset that is no boundary was answered", grain)
		}
		s.Forget(2 * grain)
		if _, ok := s.At(grain); ok && 2*grain < int64(len(data)) {
			t.Fatalf("grain %d: a forgotten boundary was answered", grain)
		}
	}

	torn := filepath.Join(dir, "torn.strap")
	cut := data[:2<<20]
	if err := os.WriteFile(torn, cut, 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(torn)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	s, err := upload.NewStreamCRCs(g, int64(len(cut)), 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Covered(); c >= int64(len(cut)) || c < int64(len(cut))-(300<<10)-4096 {
		t.Fatalf("a file torn at %d: covered %d", len(cut), c)
	}
	if got, ok := s.At(s.Covered()); !ok || got != crc32.Checksum(cut[:s.Covered()], castagnoli) {
		t.Fatalf("torn file: the covered end: %08x, %v", got, ok)
	}
	for off := int64(64 << 10); off < int64(len(cut)); off += 64 << 10 {
		got, ok := s.At(off)
		if off > s.Covered() && ok {
			t.Fatalf("torn file: At(%d) past the covered %d answered", off, s.Covered())
		}
		if ok && got != crc32.Checksum(cut[:off], castagnoli) {
			t.Fatalf("torn file: At(%d) = %08x", off, got)
		}
	}

	other := filepath.Join(dir, "x.bin")
	if err := os.WriteFile(other, randomBytes(10000, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := os.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := upload.NewStreamCRCs(h, 10000, 4096); err == nil {
		t.Fatal("a file that is not a stream got a record")
	}
}

// `strapd upload` of a finished stream: the parts' CRC32C come from the packets' record,
// none is read back whole, and the object equals the file. A packet damaged after it was
// written (its stored CRC no longer names its bytes): the server refuses that part, the
// upload reads its parts back from there on and still completes exact.
func TestUploadFinishedStreamFromPacketCRCs(t *testing.T) {
	for _, damage := range []bool{false, true} {
		f := newFixture(t)
		m := f.manager(t, true)
		path := filepath.Join(f.dir, "s.strap")
		data := writeStreamFile(t, path, 3*int(upload.MinPartSize)+777)
		if damage {
			data[len(data)/2] ^= 0x40
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		r, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		u, err := m.Begin(upload.Stream{File: r, Path: path, Target: upload.Target{Bucket: "caps", Prefix: "run/a"}})
		if err != nil {
			t.Fatal(err)
		}
		src, err := upload.NewStreamCRCs(r, int64(len(data)), m.PartSize())
		if err != nil {
			t.Fatal(err)
		}
		u.UseCRCs(src)
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		st := wait(t, u, 60*time.Second)
		if st.State != upload.StateComplete {
			t.Fatalf("damage %v: status %+v", damage, st)
		}
		if got := uploadtest.Object(t, f.client, "caps", "run/a/s.strap"); !bytes.Equal(got, data) {
			t.Fatalf("damage %v: object (%d bytes) differs from the file (%d bytes)", damage, len(got), len(data))
		}
		n := m.ReadBackParts()
		if !damage && (n != 0 || st.Errors != 0) {
			t.Fatalf("%d parts read back, %d errors; none should be", n, st.Errors)
		}
		if damage && n == 0 {
			t.Fatalf("a damaged packet's part was not read back: %+v", st)
		}
		r.Close()
	}
}

// FuzzStreamCRCs: any file bytes (a stream, cut or damaged, or none) give an error or a
// record that covers at most the file and answers only at part boundaries and its end,
// without a panic; for the undamaged seed, every answer is the CRC32C of the file's prefix.
func FuzzStreamCRCs(f *testing.F) {
	dir := f.TempDir()
	good := writeStreamFile(f, filepath.Join(dir, "seed.strap"), 16<<10) // 3 packets, 24 KiB
	f.Add(good, uint32(4096))
	f.Add(good[:len(good)/2], uint32(1000))
	f.Add(good[:len(good)-16], uint32(333))
	f.Add([]byte("not a stream at all"), uint32(7))
	// One file per worker, rewritten for each input (a file per input, and an At at every
	// grain of a grown input, made each execution cost up to a second: the fuzzer stalled).
	fh, err := os.CreateTemp(dir, "f")
	if err != nil {
		f.Fatal(err)
	}
	defer fh.Close()
	f.Fuzz(func(t *testing.T, data []byte, g uint32) {
		grain := int64(g%(1<<20)) + 256
		if len(data) > 64<<10 { // the walk's cost grows with the file, not what it finds
			data = data[:64<<10]
		}
		if err := fh.Truncate(0); err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		s, err := upload.NewStreamCRCs(fh, int64(len(data)), grain)
		if err != nil {
			return
		}
		if s.Covered() > int64(len(data)) {
			t.Fatalf("covers %d of %d bytes", s.Covered(), len(data))
		}
		exact := bytes.Equal(data, good)
		step := grain * max(1, int64(len(data))/grain/64) // at most ~64 boundaries asked
		for off := int64(0); off <= s.Covered()+grain && off <= int64(len(data)); off += step {
			c, ok := s.At(off)
			if ok && off > s.Covered() {
				t.Fatalf("At(%d) answered past the covered %d", off, s.Covered())
			}
			if ok && exact && c != crc32.Checksum(data[:off], castagnoli) {
				t.Fatalf("At(%d) = %08x, not the prefix's CRC32C", off, c)
			}
		}
	})
}
