package daemon

import (
	"sync"
	"time"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// Denied paths are audited, but a process that names the same hidden path
// in a loop must not fill the disk: identical denials (session, space, path,
// operation) are written at most once per denialWindow; the next record
// after a quiet window says how many were suppressed.
const (
	denialWindow = time.Second
	denialKeys   = 4096 // distinct denials remembered; beyond, the oldest window is forgotten
)

type denialKey struct {
	session, space, path, op string
}

type denialState struct {
	last       time.Time
	suppressed int
}

type denialLimiter struct {
	mu   sync.Mutex
	seen map[denialKey]*denialState
}

func (l *denialLimiter) init() { l.seen = map[denialKey]*denialState{} }

// admit reports whether a denial should be written now, and how many
// identical ones were suppressed since the last record.
func (l *denialLimiter) admit(k denialKey, now time.Time) (write bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.seen[k]
	if ok && now.Sub(st.last) < denialWindow {
		st.suppressed++
		return false, 0
	}
	if !ok {
		if len(l.seen) >= denialKeys {
			for key, s := range l.seen {
				if now.Sub(s.last) >= denialWindow {
					delete(l.seen, key)
				}
			}
			if len(l.seen) >= denialKeys {
				// Every remembered denial is recent: a flood of distinct
				// paths. Keep memory bounded and stop writing new ones
				// until the window passes.
				return false, 0
			}
		}
		st = &denialState{}
		l.seen[k] = st
	}
	suppressed = st.suppressed
	st.last, st.suppressed = now, 0
	return true, suppressed
}

// auditPath records a denied path, rate-limited per session and path.
func (d *Daemon) auditPath(session string, atoms cctx.Set, sp acl.Space, path, op string) {
	d.metrics.PathDenial(sp.String(), op)
	write, suppressed := d.denials.admit(denialKey{session, sp.String(), path, op}, time.Now())
	if !write {
		return
	}
	attrs := []any{"kind", "path", "session", session, "atoms", atoms.Atoms(), "space", sp.String(), "path", path, "op", op, "decision", "deny"}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	d.audit.Info("deny", attrs...)
}
