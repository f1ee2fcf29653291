package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/egress"
	"github.com/condfs/condfs/runs"
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
//
// Allowed decisions are collapsed the same way (tool.decide, a run's exec,
// a run's connections and requests): 2,000 identical allowed decisions in
// a twentieth of a second wrote 2,000 records, and one run's plain HTTP
// requests about 3,300 a second. They have a limiter of their own
// (Daemon.allowed), so a flood of allowed decisions neither holds up a
// denial nor takes its place. Every distinct decision has its record, the
// first of each is written at once, and what a session's limiters still
// hold uncounted when it closes is written then (flushCounts).
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
	msg        string
	rec        []any // the last record written, its strings shortened (flushCounts)
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

// forget drops what is remembered of session's decisions (it closed),
// and returns the states of those with repeats not yet told, and the
// number of unlisted ones.
func (l *denialLimiter) forget(session string) (pending []*denialState, unlisted int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sd := l.sessions[session]
	delete(l.sessions, session)
	if sd == nil {
		return nil, 0
	}
	for _, st := range sd.seen {
		if st.suppressed > 0 && st.rec != nil {
			pending = append(pending, st)
		} else if st.suppressed > 0 {
			sd.unlisted += st.suppressed
		}
	}
	return pending, sd.unlisted
}

// admitRecord is admit for the record msg with attrs (before counts are
// added); one to be written is kept (keep).
func (l *denialLimiter) admitRecord(session string, k denialKey, now time.Time, msg string, attrs []any) (write bool, suppressed, unlisted int) {
	write, suppressed, unlisted = l.admit(session, k, now)
	if write {
		l.keep(session, k, msg, attrs)
	}
	return write, suppressed, unlisted
}

// keep remembers the record msg (attrs, before counts are added) just
// written for k, its strings shortened, for flushCounts to tell k's
// repeats by if the session closes first.
func (l *denialLimiter) keep(session string, k denialKey, msg string, attrs []any) {
	rec := shorten(attrs)
	l.mu.Lock()
	defer l.mu.Unlock()
	if sd := l.sessions[session]; sd != nil {
		if st := sd.seen[k]; st != nil {
			st.msg, st.rec = msg, rec
		}
	}
}

// keptClip bounds each string of a record the limiter keeps: a record
// told at a session's close says what it stands for, not every byte.
const keptClip = 128

// shorten copies attrs with every string (and every string of a list)
// cut to keptClip bytes.
func shorten(attrs []any) []any {
	cut := func(s string) string {
		if len(s) <= keptClip {
			return s
		}
		c := keptClip
		for c > 0 && !utf8.RuneStart(s[c]) {
			c--
		}
		return s[:c] + "…"
	}
	out := make([]any, len(attrs))
	for i, a := range attrs {
		switch v := a.(type) {
		case string:
			out[i] = cut(v)
		case []string:
			l := make([]string, len(v))
			for j, s := range v {
				l[j] = cut(s)
			}
			out[i] = l
		case *string:
			if v != nil {
				out[i] = cut(*v)
			} else {
				out[i] = v
			}
		default:
			out[i] = a
		}
	}
	return out
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
func checker(uid uint32) string { return fmt.Sprintf("%s%d", uidKey, uid) }

// uidKey begins the limiter's key of a uid (checker): no session id holds
// a NUL.
const uidKey = "\x00uid "

// auditPathAs is auditPath, rate-limited under key. The path is clipped
// in the record and in the limiter's key: a path.check names up to 1 MiB,
// and the limiter keeps 256 keys a session.
func (d *Daemon) auditPathAs(key, session string, atoms cctx.Set, sp acl.Space, path, op string) {
	d.metrics.PathDenial(sp.String(), op)
	path = clip(path)
	in := atoms.Atoms()
	attrs := []any{"kind", "path", "session", session, "atoms", in, "space", sp.String(), "path", path, "op", op, "decision", "deny"}
	// The context is in the key: the same path denied in another context
	// is another decision, with its own record.
	d.auditDecision(false, key, denialKey{sp.String(), path, keyOf(op, keyOf(in...))}, "deny", attrs)
}

// flushCounts forgets a closed session's decisions (or a uid's made
// without a session, when the daemon closes) in both limiters and
// writes what they counted and had not told: for each decision with
// repeats since its last record, that record again (its strings
// shortened) with "suppressed" and "flushed"; for unlisted ones, a
// record with their number. Nothing is left out uncounted.
func (d *Daemon) flushCounts(session string, atoms []string) {
	for _, l := range []struct {
		lim      *denialLimiter
		decision string
	}{{&d.denials, "deny"}, {&d.allowed, "allow"}} {
		pending, unlisted := l.lim.forget(session)
		for _, st := range pending {
			d.audit.Info(st.msg, append(st.rec, "suppressed", st.suppressed, "flushed", true)...)
		}
		if unlisted > 0 {
			who := []any{"session", session}
			if uid, ok := strings.CutPrefix(session, uidKey); ok {
				who = []any{"session", "", "uid", uid}
			}
			d.audit.Info("unlisted", append(append([]any{"kind", "unlisted"}, who...), "atoms", atoms, "decision", l.decision,
				"unlisted", unlisted, "flushed", true)...)
		}
	}
}

// flushAllCounts tells what both limiters still hold uncounted, for every
// key left (the decisions made without a session, remembered per uid):
// the daemon closes.
func (d *Daemon) flushAllCounts() {
	keys := map[string]bool{}
	for _, l := range []*denialLimiter{&d.denials, &d.allowed} {
		l.mu.Lock()
		for k := range l.sessions {
			keys[k] = true
		}
		l.mu.Unlock()
	}
	for k := range keys {
		d.flushCounts(k, nil)
	}
}

// auditAllowed writes the record msg (attrs) of an allowed decision of
// session, or counts it when an identical one (k) was written less than
// denialWindow ago; the next record of k says how many it stands for.
func (d *Daemon) auditAllowed(session string, k denialKey, msg string, attrs []any) {
	d.auditDecision(true, session, k, msg, attrs)
}

// auditDecision writes a decision's record through the limiter of its
// kind (denials, or allowed decisions).
func (d *Daemon) auditDecision(allow bool, session string, k denialKey, msg string, attrs []any) {
	lim := &d.denials
	if allow {
		lim = &d.allowed
	}
	if write, suppressed, unlisted := lim.admitRecord(session, k, time.Now(), msg, attrs); write {
		d.audit.Info(msg, counts(attrs, suppressed, unlisted)...)
	}
}

// keyOf is one field of a limiter's key for what makes two records of one
// kind identical: a digest of the parts, each quoted (unambiguous), so a
// key is small whatever a caller named.
func keyOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		io.WriteString(h, strconv.Quote(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// auditRun writes the record of a run that has ended, collapsed as
// other allowed decisions are.
func (d *Daemon) auditRun(r runs.Ended) {
	argv := clipAll(r.Argv)
	d.auditAllowed(r.Session, denialKey{"exec", keyOf(keyOf(argv...), r.Cwd, keyOf(r.Atoms...)), keyOf(fmt.Sprint(r.Exit), r.Reason)}, "run",
		[]any{"kind", "exec", "session", r.Session, "atoms", r.Atoms, "argv", argv, "cwd", r.Cwd,
			"decision", "allow", "exit", r.Exit, "reason", r.Reason, "duration_ms", r.Took.Milliseconds()})
}

// auditConnect writes one decision of a run's gateway and counts it;
// atoms is the session's context, read once for the key and the record.
func (d *Daemon) auditConnect(session string, atoms []string, e egress.Event) {
	outcome := e.Decision
	switch {
	case strings.HasPrefix(e.Refused, "cut:"):
		outcome = "cut"
	case e.Refused != "":
		outcome = "refused"
	}
	d.metrics.Egress(e.Protocol, outcome)
	var suppressed, unlisted int
	var lim *denialLimiter
	var key denialKey
	if outcome != "cut" {
		// A run that retries a connection or a request in a loop must
		// not fill the disk (audit.go), allowed or refused; a cut is
		// written every time.
		// Everything the record shows is in the key: a request that
		// carried a secret, or was made in another context, is never
		// counted in the record of one that did not.
		key = denialKey{"connect", keyOf(e.Protocol, e.Host, fmt.Sprint(e.Port), e.Method, e.Path, e.Addr.String(),
			keyOf(e.Secrets...), keyOf(atoms...)),
			keyOf(append([]string{e.Decision, e.Refused}, e.Reasons...)...)}
		lim = &d.denials
		if outcome == "allow" {
			lim = &d.allowed
		}
		var write bool
		if write, suppressed, unlisted = lim.admit(session, key, time.Now()); !write {
			return
		}
	}
	attrs := []any{"kind", "connect", "session", session, "atoms", atoms,
		"host", e.Host, "port", e.Port, "protocol", e.Protocol}
	if e.Protocol == "http" || e.Method != "" {
		attrs = append(attrs, "method", clip(e.Method), "path", clip(e.Path))
	}
	if len(e.Secrets) > 0 {
		attrs = append(attrs, "secrets", e.Secrets)
	}
	if e.Addr.IsValid() {
		attrs = append(attrs, "addr", e.Addr.String())
	}
	attrs = append(attrs, "decision", e.Decision, "reasons", nonNil(clipAll(e.Reasons)))
	if e.Refused != "" {
		attrs = append(attrs, "refused", e.Refused)
	}
	if lim != nil {
		lim.keep(session, key, "connect", attrs)
	}
	d.audit.Info("connect", counts(attrs, suppressed, unlisted)...)
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}
