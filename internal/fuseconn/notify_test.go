package fuseconn

import (
	"encoding/binary"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestExpireNotificationOnTheWire: an entry the view expires reaches the
// kernel as FUSE_NOTIFY_INVAL_ENTRY with FUSE_EXPIRE_ONLY, its parent's node
// id and the name NUL-terminated, in one write; without the kernel's offer
// (or with no fd), nothing is written.
func TestExpireNotificationOnTheWire(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	n := &Notifier{}
	n.devFD.Store(int32(p[1]))
	if errno := n.expire(7, "app"); errno != syscall.ENOSYS {
		t.Fatalf("expire without the kernel's offer: %v, want ENOSYS", errno)
	}
	n.expires.Store(true)
	if errno := n.expire(7, "app"); errno != 0 {
		t.Fatalf("expire: %v", errno)
	}
	buf := make([]byte, 256)
	got, err := unix.Read(p[0], buf)
	if err != nil {
		t.Fatal(err)
	}
	buf = buf[:got]
	le := binary.LittleEndian
	// fuse_out_header (16 bytes), fuse_notify_inval_entry_out (16), "app\0".
	if got != 36 || le.Uint32(buf[0:]) != 36 || int32(le.Uint32(buf[4:])) != 3 || le.Uint64(buf[8:]) != 0 {
		t.Fatalf("header: % x", buf)
	}
	if le.Uint64(buf[16:]) != 7 || le.Uint32(buf[24:]) != 3 || le.Uint32(buf[28:]) != 1 || string(buf[32:]) != "app\x00" {
		t.Fatalf("body: % x", buf)
	}
	n.devFD.Store(0)
	if errno := n.expire(7, "app"); errno != syscall.ENOSYS {
		t.Fatalf("expire after the fd went: %v, want ENOSYS", errno)
	}
}
