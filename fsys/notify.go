package fsys

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/condfs/condfs/internal/fuseconn"
)

// entryFate is what an entry notification does to the kernel's entry of a
// name. A process whose working directory is a dropped entry has a
// directory with no name (getcwd(2) answers ENOENT) until some walk looks
// the path up again; an expired entry keeps its name.
type entryFate uint8

const (
	// entryKept: the kernel's entry is current; nothing is sent.
	entryKept entryFate = iota
	// entryExpired: the entry stays, and its next use looks it up again
	// (the daemon decides it then; an answer that differs drops it):
	// FUSE_NOTIFY_INVAL_ENTRY with FUSE_EXPIRE_ONLY, Linux ≥ 6.2.
	entryExpired
	// entryDropped: the entry is unhashed at once (FUSE_NOTIFY_INVAL_ENTRY).
	entryDropped
)

// notifyFate sends dir's entry of name what fate says.
func (v *View) notifyFate(dir *fs.Inode, name string, fate entryFate) {
	switch fate {
	case entryDropped:
		v.notifyEntry(dir, name)
	case entryExpired:
		if errno := dir.NotifyEntry(fuseconn.ExpireTag + name); errno != 0 && errno != syscall.ENOENT {
			v.log.Debug("NotifyEntry (expire)", "name", name, "errno", errno)
		}
	}
}

// notifier is the view's connection's (its own, or the hub's); nil for a
// tree not mounted.
func (v *View) notifier() *fuseconn.Notifier {
	switch {
	case v.mnt.hub != nil:
		return v.mnt.hub.Notifier()
	case v.mnt.conn != nil:
		return v.mnt.conn.Notifier()
	}
	return nil
}

// stale is the fate of an entry that only needs to be looked up again (its
// decision did not change): expired where the kernel can, else kept.
func (v *View) stale() entryFate {
	if v.notifier().CanExpire() {
		return entryExpired
	}
	return entryKept
}
