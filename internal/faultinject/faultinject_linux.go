package faultinject

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childEnv marks the re-executed copy of the program that installs the filter and then
// becomes the target (see ChildMain); its value is the socket's descriptor number.
const childEnv = "STRAP_FAULTINJECT_CHILD"

// Rule says which writes fail: those to a file directly in Dir once the file holds at
// least After bytes, while Armed exists (always, if Armed is empty). Checking Armed on
// every call lets a test remove the fault without restarting the target.
type Rule struct {
	Dir   string
	After int64
	Armed string
	// Log, if set, is called with the file and its size for each write failed.
	Log func(path string, size int64)
}

// Process is a target started under the filter.
type Process struct {
	cmd      *exec.Cmd
	listener int
	rule     Rule
	done     chan struct{}

	mu       sync.Mutex
	injected uint64
	last     string // the file of the last injected EIO
}

// The kernel's seccomp notification structs (linux/seccomp.h); x/sys/unix has the ioctl
// numbers but not the structs.
type seccompData struct {
	Nr                 int32
	Arch               uint32
	InstructionPointer uint64
	Args               [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// writeSyscalls are the calls the filter hands over: every way strapd (or anything)
// writes file data through a descriptor.
var writeSyscalls = []uint32{unix.SYS_WRITE, unix.SYS_WRITEV, unix.SYS_PWRITE64, unix.SYS_PWRITEV, unix.SYS_PWRITEV2}

// Start runs argv (argv[0] a path) with stdio as given, under a filter that fails the
// writes rule names with EIO. The running program must call ChildMain first thing in
// main (or TestMain): the child is this program re-executed, which installs the filter
// on itself and then execs argv.
func Start(rule Rule, argv []string, stdin, stdout, stderr *os.File) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("faultinject: no command")
	}
	dir, err := filepath.Abs(rule.Dir)
	if err != nil {
		return nil, fmt.Errorf("faultinject: %w", err)
	}
	rule.Dir = filepath.Clean(dir)
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("faultinject: %w", err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultinject: socketpair: %w", err)
	}
	parent := os.NewFile(uintptr(pair[0]), "faultinject-parent")
	child := os.NewFile(uintptr(pair[1]), "faultinject-child")
	defer parent.Close()
	cmd := exec.Command(self, argv...)
	cmd.Env = append(os.Environ(), childEnv+"=3")
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// Without its supervisor the target's writes would fail with ENOSYS: it goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		child.Close()
		return nil, fmt.Errorf("faultinject: start: %w", err)
	}
	child.Close()
	fd, err := recvFD(pair[0])
	if err != nil {
		_ = cmd.Process.Kill()
		werr := cmd.Wait()
		return nil, fmt.Errorf("faultinject: the child did not hand over its seccomp listener (%v): %w", werr, err)
	}
	p := &Process{cmd: cmd, listener: fd, rule: rule, done: make(chan struct{})}
	go p.serve()
	return p, nil
}

// Injected is how many writes have failed so far, and the file of the last one.
func (p *Process) Injected() (uint64, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.injected, p.last
}

// Signal sends sig to the target.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits for the target to exit and stops answering its calls.
func (p *Process) Wait() error {
	err := p.cmd.Wait()
	<-p.done
	return err
}

// serve answers the target's write calls until it has exited (the listener hangs up).
func (p *Process) serve() {
	defer close(p.done)
	defer unix.Close(p.listener)
	for {
		fds := []unix.PollFd{{Fd: int32(p.listener), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			return // POLLHUP: no task uses the filter any more
		}
		var req seccompNotif // the kernel wants it zeroed
		if err := ioctl(p.listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)); err != nil {
			if err == unix.EINTR || err == unix.ENOENT {
				continue // ENOENT: the caller died or was interrupted before we read it
			}
			return
		}
		resp := seccompNotifResp{ID: req.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		if path, size, ok := p.fails(&req); ok {
			resp.Flags, resp.Error = 0, -int32(unix.EIO)
			p.mu.Lock()
			p.injected++
			p.last = path
			p.mu.Unlock()
			if p.rule.Log != nil {
				p.rule.Log(path, size)
			}
		}
		// ENOENT: the caller was interrupted by a signal meanwhile; it restarts the call.
		_ = ioctl(p.listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
}

// fails says whether the call in req is a write the rule fails, to which file and at
// which size.
func (p *Process) fails(req *seccompNotif) (string, int64, bool) {
	if p.rule.Armed != "" {
		if _, err := os.Stat(p.rule.Armed); err != nil {
			return "", 0, false
		}
	}
	fdPath := "/proc/" + strconv.FormatUint(uint64(req.Pid), 10) + "/fd/" + strconv.FormatUint(req.Data.Args[0]&0xffffffff, 10)
	target, err := os.Readlink(fdPath)
	if err != nil || filepath.Dir(target) != p.rule.Dir {
		return "", 0, false
	}
	st, err := os.Stat(fdPath)
	if err != nil || !st.Mode().IsRegular() || st.Size() < p.rule.After {
		return "", 0, false
	}
	return target, st.Size(), true
}

// IsChild reports whether this process is the re-executed child of Start.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ChildMain, in the child of Start, installs the filter, hands its listener to the parent
// and execs os.Args[1:]; it never returns. Elsewhere it returns at once.
func ChildMain() {
	if !IsChild() {
		return
	}
	sock, err := strconv.Atoi(os.Getenv(childEnv))
	if err != nil || len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "faultinject child: bad %s=%q or no command\n", childEnv, os.Getenv(childEnv))
		os.Exit(127)
	}
	os.Unsetenv(childEnv)
	// The filter belongs to this thread; exec keeps only this thread.
	runtime.LockOSThread()
	fd, err := installFilter()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faultinject child: %v\n", err)
		os.Exit(127)
	}
	if err := unix.Sendmsg(sock, []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
		fmt.Fprintf(os.Stderr, "faultinject child: send listener: %v\n", err)
		os.Exit(127)
	}
	unix.Close(fd)
	unix.Close(sock)
	argv0, err := exec.LookPath(os.Args[1])
	if err == nil {
		err = syscall.Exec(argv0, os.Args[1:], os.Environ())
	}
	fmt.Fprintf(os.Stderr, "faultinject child: exec %s: %v\n", os.Args[1], err)
	os.Exit(127)
}

// installFilter sets no_new_privs (so no root is needed) and a seccomp filter that sends
// writeSyscalls to a listener and allows everything else; it returns the listener. There
// is no architecture check: the target is a native 64-bit program, and a compat call that
// shared a number would only be looked at and, not being a write to the rule's files,
// continued.
func installFilter() (int, error) {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("no_new_privs: %w", err)
	}
	n := len(writeSyscalls)
	prog := []unix.SockFilter{{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}} // seccomp_data.nr
	for i, nr := range writeSyscalls {
		// Equal: jump to the USER_NOTIF return after the remaining compares and ALLOW.
		prog = append(prog, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: nr, Jt: uint8(n - i)})
	}
	prog = append(prog,
		unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF})
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, fmt.Errorf("seccomp with a user-notification listener (Linux 5.5+): %w", errno)
	}
	return int(fd), nil
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// recvFD receives one descriptor sent with SCM_RIGHTS.
func recvFD(sock int) (int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("no descriptor in the message (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, fmt.Errorf("no descriptor in the message (%v)", err)
	}
	return fds[0], nil
}
