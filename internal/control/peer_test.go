package control

import (
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPeerGroups(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	got, err := PeerGroups(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	g := make([]int, len(got))
	for i, v := range got {
		g[i] = int(v)
	}
	slices.Sort(g)
	slices.Sort(want)
	if !slices.Equal(g, want) {
		t.Fatalf("peer groups %v, want this process's %v", g, want)
	}
	if _, err := PeerGroups(-1); err == nil {
		t.Fatal("PeerGroups(-1): no error")
	}
}
