package fsys

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Locks: flock(2), POSIX record locks and OFD locks on a view's files,
// held on the handle's backing fd (go-fuse's LoopbackFile: POSIX locks
// become OFD locks of that fd).
//
// A lock request is an operation on a handle like a read: it runs as the
// caller and is decided again, so a handle the context no longer allows
// takes and tests no lock (EACCES), and one of a closed view none at all
// (EIO). Releasing (F_UNLCK) is not decided: giving a lock up grants
// nothing, and a denied handle must be able to let go of what it holds.
//
// A blocking request (flock without LOCK_NB, F_SETLKW, F_OFD_SETLKW) never
// blocks a thread. go-fuse's loopback waits in flock(2) or F_OFD_SETLKW,
// holding one OS thread, uninterruptibly, for as long as another holder
// keeps the lock: waiters grew the daemon's threads without bound (a pids
// limit then killed it) and a killed waiter stayed in D state until the
// lock came free. Here a blocking request makes non-blocking attempts
// (LOCK_NB, F_OFD_SETLK); between them its goroutine gives up the caller's
// credentials and its thread (unpin) and sleeps, from 1 ms doubling to
// 100 ms. It ends:
//   - with the lock, or an attempt's error other than EAGAIN;
//   - with EINTR when the kernel interrupts the request (FUSE_INTERRUPT:
//     the caller got a signal; the kernel restarts the call if its handler
//     asks for that, and a killed caller is released at once);
//   - with EACCES or EIO when a switch denies the handle or its view closes;
//   - with ENOLCK, at once and without waiting, when MaxLockWaitersPerView
//     requests of the view, or MaxLockWaiters of all views, already wait.
//
// Polling is not fair: a newcomer's attempt may take a lock a waiter has
// waited longer for, and a lock is taken up to 100 ms after it came free.
// OFD locks have no deadlock detection (EDEADLK), as before.

// MaxLockWaitersPerView and MaxLockWaiters bound the blocking lock requests
// waiting at once in one view and in all; one more is answered ENOLCK.
const (
	MaxLockWaitersPerView = 32
	MaxLockWaiters        = 256
)

const (
	lockPollFirst = time.Millisecond
	lockPollMax   = 100 * time.Millisecond
)

// enterWait takes a waiter's place in v and in all views, if one is free.
func (v *View) enterWait() bool {
	all := &v.host.lockWaiters
	if all.Add(1) > MaxLockWaiters {
		all.Add(-1)
		return false
	}
	if v.stats.lockWaiters.Add(1) > MaxLockWaitersPerView {
		v.stats.lockWaiters.Add(-1)
		all.Add(-1)
		return false
	}
	return true
}

func (v *View) leaveWait() {
	v.stats.lockWaiters.Add(-1)
	v.host.lockWaiters.Add(-1)
}

// lockOp runs one lock call on the handle's fd as the caller, decided
// like a read unless it releases.
func (h *fileHandle) lockOp(ctx context.Context, release bool, op func() syscall.Errno) syscall.Errno {
	a, errno := h.node.view.become(ctx)
	if errno != 0 {
		return errno
	}
	defer a.restore()
	if !release && !h.decide(true) {
		return syscall.EACCES
	}
	return op()
}

func (h *fileHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return h.lockOp(ctx, false, func() syscall.Errno { return h.lf.Getlk(ctx, owner, lk, flags, out) })
}

func (h *fileHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.lockOp(ctx, lk.Typ == syscall.F_UNLCK, func() syscall.Errno { return h.lf.Setlk(ctx, owner, lk, flags) })
}

// Setlkw waits for a lock without holding a thread (see the top of this
// file).
func (h *fileHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	errno := h.Setlk(ctx, owner, lk, flags)
	if errno != syscall.EAGAIN || lk.Typ == syscall.F_UNLCK {
		return errno
	}
	return h.node.view.waitRetry(ctx, syscall.ENOLCK, time.Time{}, func() syscall.Errno { return h.Setlk(ctx, owner, lk, flags) })
}

// waitRetry calls op, which answered EAGAIN, again until it answers
// anything else, waiting between calls without a thread or an acting
// place: lockPollFirst doubling to lockPollMax. It answers EINTR when the
// caller is interrupted, busy at once when no waiter's place is free, and
// EAGAIN after deadline (if set).
func (v *View) waitRetry(ctx context.Context, busy syscall.Errno, deadline time.Time, op func() syscall.Errno) syscall.Errno {
	if !v.enterWait() {
		return busy
	}
	defer v.leaveWait()
	t := time.NewTimer(lockPollFirst)
	defer t.Stop()
	for delay := lockPollFirst; ; {
		v.host.threads.unpin()
		select {
		case <-ctx.Done():
			return syscall.EINTR
		case <-t.C:
		}
		if errno := op(); errno != syscall.EAGAIN {
			return errno
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return syscall.EAGAIN
		}
		delay = min(2*delay, lockPollMax)
		t.Reset(delay)
	}
}
