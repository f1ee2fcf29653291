package daemon

import (
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// Denials are audited, but a process that names the same hidden path (or
// connects to the same denied host) in a loop must not fill the disk:
// identical denials of a session are written at most once per
// denialWindow, and the next record of one says how many were suppressed.
//
// Each session has its own memory of them, so that one session's flood
// neither hides another's denials nor takes their place: at most
// denialKeys distinct denials are remembered per session. Beyond that,
// while every one remembered is recent (a flood of distinct names), the
// session's new denials are counted, not itemised, and its next record
// says how many ("unlisted"): nothing denied goes unrecorded.
const (
	denialWindow = time.Second
	denialKeys   = 256 // distinct denials remembered per session
)

type denialKey struct {
	space, path, op string // space "connect": the connection or request in path
}

type denialState struct {
	last       time.Time
	suppressed int
}

type denialLimiter struct {
	mu       sync.Mutex
	sessions map[string]*sessionDenials
}

type sessionDenials struct {
	seen     map[denialKey]*denialState
	unlisted int // denials counted while seen was full of recent ones
}

func (l *denialLimiter) init() { l.sessions = map[string]*sessionDenials{} }

// forget drops what is remembered of session's denials (it closed).
func (l *denialLimiter) forget(session string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.sessions, session)
}

// admit reports whether a denial of session should be written now, how
// many identical ones were suppressed since its last record, and how many
// of the session's denials went unlisted since its last record of any.
func (l *denialLimiter) admit(session string, k denialKey, now time.Time) (write bool, suppressed, unlisted int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sd := l.sessions[session]
	if sd == nil {
		sd = &sessionDenials{seen: map[denialKey]*denialState{}}
		l.sessions[session] = sd
	}
	st, ok := sd.seen[k]
	if ok && now.Sub(st.last) < denialWindow {
		st.suppressed++
		return false, 0, 0
	}
	if !ok {
		if len(sd.seen) >= denialKeys {
			for key, s := range sd.seen {
				if now.Sub(s.last) >= denialWindow {
					// Its suppressed ones are told as unlisted.
					sd.unlisted += s.suppressed
					delete(sd.seen, key)
				}
			}
			if len(sd.seen) >= denialKeys {
				sd.unlisted++
				return false, 0, 0
			}
		}
		st = &denialState{}
		sd.seen[k] = st
	}
	suppressed, unlisted = st.suppressed, sd.unlisted
	st.last, st.suppressed, sd.unlisted = now, 0, 0
	return true, suppressed, unlisted
}

// counts appends the suppressed and unlisted counts to a record's attrs.
func counts(attrs []any, suppressed, unlisted int) []any {
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	if unlisted > 0 {
		attrs = append(attrs, "unlisted", unlisted)
	}
	return attrs
}

// Audit records hold what a caller named, clipped: a tool.decide of a
// tool name and 15 roles of 60,000 characters each (within the request's
// bounds) wrote a record of about 1 MB, every time. Each string a caller
// chose is kept to its first auditClip bytes and its length.
const auditClip = 1024

// clip shortens s for an audit record.
func clip(s string) string {
	if len(s) <= auditClip {
		return s
	}
	cut := auditClip
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes in all)", s[:cut], len(s))
}

// clipAll clips each string of ss (a new slice; nil stays nil).
func clipAll(ss []string) []string {
	if ss == nil {
		return nil
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = clip(s)
	}
	return out
}

// auditPath records a denied path, rate-limited per session and path.
func (d *Daemon) auditPath(session string, atoms cctx.Set, sp acl.Space, path, op string) {
	d.auditPathAs(session, session, atoms, sp, path, op)
}

// checker is the limiter's key for the denials of a path.check made with
// a context, not a session: each uid's own ("" for all of them let one
// uid's flood of distinct denied checks hide root's).
func checker(uid uint32) string { return fmt.Sprintf("\x00uid %d", uid) }

// auditPathAs is auditPath, rate-limited under key. The path is clipped
// in the record and in the limiter's key: a path.check names up to 1 MiB,
// and the limiter keeps 256 keys a session.
func (d *Daemon) auditPathAs(key, session string, atoms cctx.Set, sp acl.Space, path, op string) {
	d.metrics.PathDenial(sp.String(), op)
	path = clip(path)
	write, suppressed, unlisted := d.denials.admit(key, denialKey{sp.String(), path, op}, time.Now())
	if !write {
		return
	}
	attrs := []any{"kind", "path", "session", session, "atoms", atoms.Atoms(), "space", sp.String(), "path", path, "op", op, "decision", "deny"}
	d.audit.Info("deny", counts(attrs, suppressed, unlisted)...)
}
