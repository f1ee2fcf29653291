package changes

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Owner is whose authority a store reads the trees' current content with
// for changes.diff: the session's owner's uid and primary gid, without
// supplementary groups (what it cannot read that way is not shown).
type Owner struct{ UID, GID uint32 }

// asOwner runs f with the filesystem credentials of the store's owner and
// reports whether it could: on a new thread whose fsuid and fsgid are the
// owner's and which has no supplementary groups (a root daemon drops its
// filesystem capabilities with fsuid). The thread is never given back: its
// goroutine exits locked, which ends it. A daemon that is the owner runs f
// as itself; one that cannot switch (not root) does not run f.
func (s *Store) asOwner(f func()) bool { return runAs(s.opts.Owner, f) }

// runAs runs f with o's filesystem credentials, as Store.asOwner says; f
// runs as the daemon when o is nil.
func runAs(o *Owner, f func()) bool {
	if o == nil || (uint32(os.Geteuid()) == o.UID && uint32(os.Getegid()) == o.GID) {
		f()
		return true
	}
	done := make(chan bool, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with it
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			done <- false
			return
		}
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(o.GID), 0, 0)
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(o.UID), 0, 0)
		// setfsuid and setfsgid answer the previous id, whether or not
		// they changed it: ask again (an invalid id changes nothing).
		gid, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
		uid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
		if uint32(uid) != o.UID || uint32(gid) != o.GID {
			done <- false
			return
		}
		f()
		done <- true
	}()
	return <-done
}
