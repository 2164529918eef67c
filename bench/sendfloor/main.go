// Command sendfloor measures what it costs this machine's kernel to push a file's bytes to a
// TCP receiver on loopback, the way strapd sends an upload's parts to a local S3 server:
// the floor under "strapd CPU for upload per GB" when the server is on the same host
// (docs/PERFORMANCE.md "Upload to object storage").
//
// The file is written with O_DIRECT and dropped from the page cache, as a capture leaves
// it. Modes, each timed by the sender's own CPU (getrusage: user + system) per GB; the
// receiver is a child process that reads and discards:
//
//	cold      sendfile(2) of the uncached file (what strapd does: page cache fill + TCP)
//	warm      sendfile(2) of the file once it is in the page cache (TCP alone)
//	willneed  posix_fadvise(WILLNEED) of the whole file, then sendfile
//	direct    O_DIRECT pread into a 4 MiB buffer, then write(2) (no page cache)
//	mem       write(2) of bytes already in memory (sending from the capture's buffers)
//
// Usage:
//
//	go run ./bench/sendfloor -dir /var/tmp -mib 512 -rounds 5
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-receive" {
		receive()
		return
	}
	dir := flag.String("dir", os.TempDir(), "directory of the test file (the disk a capture is on)")
	mib := flag.Int("mib", 512, "file size in MiB")
	rounds := flag.Int("rounds", 5, "rounds (each runs every mode, in rotating order)")
	modes := flag.String("modes", "cold,warm,willneed,direct,mem", "modes to run")
	flag.Parse()
	size := int64(*mib) << 20

	rx := exec.Command(os.Args[0], "-receive")
	out, err := rx.StdoutPipe()
	check(err)
	rx.Stderr = os.Stderr
	check(rx.Start())
	defer rx.Process.Kill()
	addr, err := bufio.NewReader(out).ReadString('\n')
	check(err)
	addr = strings.TrimSpace(addr)

	path := filepath.Join(*dir, fmt.Sprintf("sendfloor-%d.bin", os.Getpid()))
	defer os.Remove(path)
	ms := strings.Split(*modes, ",")
	res := map[string][]float64{}
	for r := range *rounds {
		for i := range ms {
			m := ms[(i+r)%len(ms)]
			writeUncached(path, size)
			cpu, mbs := run(m, path, addr, size)
			res[m] = append(res[m], cpu)
			fmt.Printf("round %d %-8s %.3f CPU-s/GB  %5.0f MB/s\n", r+1, m, cpu, mbs)
		}
	}
	fmt.Printf("medians (%d rounds, %d MiB):", *rounds, *mib)
	for _, m := range ms {
		v := append([]float64(nil), res[m]...)
		sort.Float64s(v)
		fmt.Printf("  %s %.3f", m, v[len(v)/2])
	}
	fmt.Println(" CPU-s/GB")
}

// receive accepts connections and discards what they send (the S3 server's side, alone).
func receive() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	fmt.Println(l.Addr())
	for {
		c, err := l.Accept()
		check(err)
		go func() {
			_, _ = io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
			c.Close()
		}()
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func aligned(n int) []byte {
	b := make([]byte, n+4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)) & 4095
	return b[off : off+n]
}

// writeUncached writes size bytes with O_DIRECT and drops any cached pages of the file.
func writeUncached(path string, size int64) {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_DIRECT, 0o600)
	check(err)
	b := aligned(4 << 20)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	for w := int64(0); w < size; w += int64(len(b)) {
		_, err := unix.Write(fd, b)
		check(err)
	}
	check(unix.Fsync(fd))
	check(unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED))
	check(unix.Close(fd))
}

// run sends the file's bytes to addr by mode; the sender's CPU-s per GB and MB/s.
func run(mode, path, addr string, size int64) (float64, float64) {
	c, err := net.Dial("tcp", addr)
	check(err)
	defer c.Close()
	f, err := os.Open(path)
	check(err)
	defer f.Close()
	if mode == "warm" {
		_, err := io.Copy(io.Discard, f)
		check(err)
		_, err = f.Seek(0, io.SeekStart)
		check(err)
	}
	var mem []byte
	if mode == "mem" {
		mem = aligned(4 << 20)
	}
	t0, c0 := time.Now(), cpuSeconds()
	switch mode {
	case "cold", "warm", "willneed":
		if mode == "willneed" {
			check(unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_WILLNEED))
		}
		n, err := c.(*net.TCPConn).ReadFrom(f) // sendfile
		check(err)
		if n != size {
			panic(fmt.Sprintf("sent %d of %d bytes", n, size))
		}
	case "direct":
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
		check(err)
		defer unix.Close(fd)
		b := aligned(4 << 20)
		for off := int64(0); off < size; off += int64(len(b)) {
			n, err := unix.Pread(fd, b, off)
			check(err)
			_, err = c.Write(b[:n])
			check(err)
		}
	case "mem":
		for off := int64(0); off < size; off += int64(len(mem)) {
			_, err := c.Write(mem)
			check(err)
		}
	default:
		panic("unknown mode " + mode)
	}
	cpu, wall := cpuSeconds()-c0, time.Since(t0).Seconds()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	gb := float64(size) / 1e9
	return cpu / gb, gb * 1e3 / wall
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "sendfloor:", err)
		os.Exit(1)
	}
}
