package fsys

import (
	"runtime"
	"syscall"
)

// Requests acting at once. Every FUSE request's backing work (the part that
// acts as the caller, from become to restore, and a handle's read, write,
// fsync, seek, allocate, fstat and close) runs holding a place among
// maxActing in the daemon and maxActingPerView in its view. A request
// that finds no place waits for one as a plain goroutine: with its
// thread's pin and credentials given back first (unpin), so it holds no OS
// thread. The wait is not ended by FUSE_INTERRUPT: it lasts until other
// requests finish their backing work, and answering EINTR would surface
// in callers whose signal handlers ask for restarts (a Go program's
// preemption signal alone did); a killed caller is released by the kernel
// at once.
//
// Why: a goroutine pinned to act as a caller keeps its OS thread through
// every wait (a Go mutex, the group cache, go-fuse's own locks, a
// syscall), and a goroutine in a slow syscall takes one too. Without a
// bound, the daemon's threads followed the number of callers' threads with
// requests in flight: 400 threads of uid 65534 listing its own view grew
// the daemon past a pids limit of 200 and killed it, and every session.
//
// Order: a place is taken before anything a request may wait on that other
// requests hold (the view's and go-fuse's locks), and never while holding
// one; nothing holding a place waits for the kernel to finish another
// request (notifications that wait for requests in flight run with no
// place held, e.g. a rename's revokeMoved after restore). So the holders
// always make progress and a waiter gets a place.
//
// The view's share comes first: one view's requests (however many callers
// and threads, or a backing that hangs in a syscall) hold at most
// maxActingPerView places, and the rest of its requests wait in its own
// queue, not in the daemon's; the other views keep maxActing less that.

// callerState is how a view acts as its callers.
type callerState struct {
	switchCreds bool // root: act as each caller
	groups      groupCache
	// acting holds a token for each of the view's requests acting at once.
	acting chan struct{}
}

// maxActing is 4 × GOMAXPROCS + 8: enough to keep every CPU busy while as
// many requests wait in backing syscalls, far below any pids limit. The
// bounds are read when a host (or view) is made: GOMAXPROCS may change
// later (the runtime follows its cgroup's CPU limit), a channel's room
// cannot.
func maxActing() int { return 4*runtime.GOMAXPROCS(0) + 8 }

// maxActingPerView is a quarter of maxActing (at least 2): four views whose
// backing hangs are needed to stall the others.
func maxActingPerView() int { return max(maxActing()/4, 2) }

// maxIdlePins bounds the goroutines that keep a caller's credentials (and
// their thread) between requests: about go-fuse's readers of one
// connection (clamp(GOMAXPROCS, 2, 16) + 1), so that a caller's next
// request usually finds its credentials set.
func maxIdlePins() int { return min(max(runtime.GOMAXPROCS(0), 2), 16) + 2 }

// enterActing takes a place in v and on its host, waiting for one
// unpinned if it must.
func (v *View) enterActing() {
	v.host.threads.take(v.caller.acting)
	v.host.threads.take(v.host.acting)
}

// leaveActing gives back what enterActing took.
func (v *View) leaveActing() {
	<-v.host.acting
	<-v.caller.acting
}

// take puts a token in ch, waiting for room with no thread held.
func (ts *threadSet) take(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
		return
	default:
	}
	ts.unpin()
	ch <- struct{}{}
}

// acts runs a handle's backing work holding a place (the caller's
// credentials do not matter to it: the fd was opened as the caller).
func (v *View) acts(work func() syscall.Errno) syscall.Errno {
	v.enterActing()
	defer v.leaveActing()
	return work()
}
