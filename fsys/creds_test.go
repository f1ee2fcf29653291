package fsys

import (
	"context"
	"os"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// callerCtx is a FUSE request context from uid, gid and this process's pid
// (whose /proc status is read for groups).
func callerCtx(uid, gid uint32) context.Context {
	return &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: gid}, Pid: uint32(os.Getpid())}}
}

// TestBecomeActsAsTheCaller checks, as root, that a switched thread has the
// caller's fsuid and that restore gives the daemon's back.
func TestBecomeActsAsTheCaller(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching credentials needs root; the integration tests run it as root in CI")
	}
	f := newFixture(t, "", dm)
	f.v.opts.Owner = uint32(os.Getuid())
	f.v.opts.AllowUIDs = []uint32{uint32(os.Getuid())}
	// The test process's own pid reports fsuid 0 in /proc, so ask as root
	// with another gid: the switch must then not happen (root calling root).
	a, errno := f.v.become(callerCtx(0, 0))
	if errno != 0 || a.switched {
		t.Fatalf("root caller: switched=%v errno %v", a.switched, errno)
	}
	a.restore()
	// A caller whose /proc entry does not match its fsuid is refused:
	// its groups cannot be known.
	f.v.opts.AllowUIDs = []uint32{65534}
	if _, errno := f.v.become(callerCtx(65534, 65534)); errno == 0 {
		t.Fatal("a caller whose pid does not have its uid was let in")
	}
}

// BenchmarkBecome measures a credential switch and its restore (what every
// backing operation of a root daemon for a non-root caller adds), beside one
// fstat as the baseline in the same run.
func BenchmarkBecome(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	b.Run("baseline-fstat", func(b *testing.B) {
		var st unix.Stat_t
		for b.Loop() {
			unix.Fstat(1, &st)
		}
	})
	b.Run("switch-restore", func(b *testing.B) {
		groups := []uint32{65534, 100}
		for b.Loop() {
			lockAndSet(65534, 65534, groups)
			restoreThread()
		}
	})
}

func lockAndSet(uid, gid int, groups []uint32) {
	lockOSThread()
	if err := setThreadCreds(uid, gid, groups); err != nil {
		panic(err)
	}
}
