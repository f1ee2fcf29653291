package fsys

import (
	"context"
	"os"
	"testing"
	"time"

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
	if errno != 0 || a.switched || a.back != nil {
		t.Fatalf("root caller: switched=%v errno %v", a.switched, errno)
	}
	a.restore()
	// A caller whose /proc entry does not match its fsuid is refused:
	// its groups cannot be known.
	f.v.opts.AllowUIDs = []uint32{65534}
	liar := callerCtx(65534, 65534)
	liar.(*fuse.Context).Caller.Pid = 1 // init: root, never 65534
	if _, errno := f.v.become(liar); errno == 0 {
		t.Fatal("a caller whose pid does not have its uid was let in")
	}
}

// asUser pretends pid (this process) asked as uid/gid with groups: the
// group cache is filled so that /proc (which shows root) is not read.
func (f *fixture) asUser(uid, gid uint32, groups ...uint32) context.Context {
	f.v.caller.groups.mu.Lock()
	if f.v.caller.groups.entries == nil {
		f.v.caller.groups.entries = map[uint32]groupEntry{}
	}
	f.v.caller.groups.entries[uint32(os.Getpid())] = groupEntry{uid: uid, gid: gid, groups: groups, at: time.Now().Add(time.Hour)}
	f.v.caller.groups.mu.Unlock()
	f.v.opts.AllowUIDs = append(f.v.opts.AllowUIDs, uid)
	return callerCtx(uid, gid)
}

// TestStickyCredentials: a goroutine that acted as a caller keeps its
// thread, in that caller's credentials, until another caller or root asks;
// a root request on such a thread runs as the daemon and gives the caller's
// credentials back.
func TestStickyCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching credentials needs root")
	}
	f := newFixture(t, "", dm)
	done := make(chan struct{})
	go func() { // its own goroutine: it ends pinned, and its thread with it
		defer close(done)
		nobody := f.asUser(65534, 65534, 65534)
		fsuid := func() int { u, _ := unix.SetfsuidRetUid(-1); return u }
		a, errno := f.v.become(nobody)
		if errno != 0 || !a.switched || fsuid() != 65534 {
			t.Errorf("become nobody: %v %v fsuid %d", a, errno, fsuid())
		}
		a.restore()
		if fsuid() != 65534 {
			t.Errorf("the thread should keep the caller's credentials, fsuid %d", fsuid())
		}
		r, errno := f.v.become(callerCtx(0, 0))
		if errno != 0 || r.switched || fsuid() != 0 {
			t.Errorf("root on a pinned thread: %v %v fsuid %d", r, errno, fsuid())
		}
		// As the daemon: a root-only file is readable.
		if _, err := os.ReadFile("/proc/self/status"); err != nil {
			t.Error(err)
		}
		r.restore()
		if fsuid() != 65534 {
			t.Errorf("after the root request, fsuid %d", fsuid())
		}
	}()
	<-done
	// This goroutine never switched: its thread is the daemon's.
	if u, _ := unix.SetfsuidRetUid(-1); u != 0 {
		t.Fatalf("an unpinned thread has fsuid %d", u)
	}
}

// BenchmarkBecome measures what a root daemon adds to each backing
// operation for a non-root caller: the same caller again (the thread keeps
// its credentials), and two callers alternating (a switch every time);
// beside one fstat as the baseline in the same run.
func BenchmarkBecome(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	t := &testing.T{}
	f := newFixture(t, "", dm)
	b.Run("baseline-fstat", func(b *testing.B) {
		var st unix.Stat_t
		for b.Loop() {
			unix.Fstat(1, &st)
		}
	})
	b.Run("same-caller", func(b *testing.B) {
		ctx := f.asUser(65534, 65534, 65534, 100)
		for b.Loop() {
			a, errno := f.v.become(ctx)
			if errno != 0 || !a.switched {
				b.Fatal(errno)
			}
			a.restore()
		}
	})
	b.Run("alternating-callers", func(b *testing.B) {
		// The cache is keyed by pid: the second caller gets a pid of its own.
		other := callerCtx(65533, 65533)
		other.(*fuse.Context).Caller.Pid = 1
		ctxs := []context.Context{f.asUser(65534, 65534, 100), other}
		f.v.caller.groups.entries[1] = groupEntry{uid: 65533, gid: 65533, at: time.Now().Add(time.Hour)}
		f.v.opts.AllowUIDs = append(f.v.opts.AllowUIDs, 65533)
		i := 0
		for b.Loop() {
			a, errno := f.v.become(ctxs[i&1])
			if errno != 0 || !a.switched {
				b.Fatal(errno)
			}
			a.restore()
			i++
		}
	})
}
