package runs

// Sandboxes kept for a session's next run. A run's sandbox (namespaces,
// root, clones, cgroups) costs far more than starting its command, and
// agents run commands one after another in the same session. So when a
// run's command has ended, its sandbox is kept for the session's next run
// (sandbox.Run.Again: no process of the run is left, its /tmp and /dev/shm
// are replaced by empty ones, the next command forks in a new IPC
// namespace), and the next run only begins its command in it (Begin).
// Nothing is decided ahead: the policy's decision, the cwd and the
// binaries the context allows are taken when the run comes, and Begin
// attaches those binaries before the command starts, under the session's
// switch lock. A run that was killed (timeout, client gone, session
// closed) leaves nothing.
//
// A kept sandbox is used only by a run whose sandbox would be built the
// same (the key: owner, groups, view, [sandbox] binaries, network, limits,
// the index of the host's programs);
// any other is dropped. Only a session that runs commands in a row keeps
// one (its last run began less than idle before this one): on a node of
// many sessions, one that runs a command now and then would only evict
// another's. The pool holds at most max (the least recently kept goes
// first) and each for at most idle: a kept one holds an init process, a
// cgroup and a clone of its session's view.
// Lock order: Session.mu before warmPool.mu (node.go).

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/sandbox"
)

// warmIdle is how long a kept sandbox waits for its run.
const warmIdle = 2 * time.Minute

type warmPool struct {
	mu      sync.Mutex // guards the fields below
	max     int
	closed  bool
	entries map[*Session]*warmRun
	wg      sync.WaitGroup // preparations and discards in flight

	// counted for status
	warmStarts, coldStarts, kept, discarded atomic.Int64
}

type warmRun struct {
	key   string
	since time.Time
	ready chan struct{} // closed once prepared (b or err set)
	b     *box
	err   error
	timer *time.Timer // drops it after warmIdle
}

// warmKey is what a kept sandbox must have been built from to serve spec's
// run: the spec, and the index of the host's programs it covers (the
// current one to take; the run's own to keep: a new scan retires the
// sandboxes built with the one before).
func warmKey(spec sandbox.Spec, indexed string) string {
	spec.Argv, spec.Env, spec.Cwd, spec.Allowed = nil, nil, "", nil
	b, _ := json.Marshal(spec)
	return string(b) + " " + indexed
}

func newWarmPool(max int) *warmPool {
	return &warmPool{max: max, entries: map[*Session]*warmRun{}}
}

// take returns rs's kept sandbox if it was built for key (waiting for one
// being readied), or nil. The caller owns what it gets.
func (p *warmPool) take(rs *Session, key string) *box {
	p.mu.Lock()
	w := p.entries[rs]
	delete(p.entries, rs)
	p.mu.Unlock()
	if w == nil {
		return nil
	}
	<-w.ready // its expiry timer is set only while it is in the map
	if w.err != nil {
		return nil
	}
	if w.key != key || w.b.r.Ended() {
		p.discard(w)
		return nil
	}
	return w.b
}

// status is the pool as the status method shows it.
func (p *warmPool) status() map[string]any {
	return map[string]any{"prepared": p.size(), "max_prepared": p.max,
		"warm_starts": p.warmStarts.Load(), "cold_starts": p.coldStarts.Load(), "kept": p.kept.Load(), "discarded": p.discarded.Load()}
}

// inRow records that a run of rs begins now, and reports whether the one
// before began less than warmIdle ago: whether rs runs commands in a row.
func (p *warmPool) inRow(rs *Session) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	now := time.Now()
	recent := !rs.lastRun.IsZero() && now.Sub(rs.lastRun) < warmIdle
	rs.lastRun = now
	return recent
}

// keep makes b, whose command has ended, rs's sandbox for its next run
// (Again runs in the background), or ends b when rs is closed, already has
// one, or the pool is full of sandboxes being readied. It returns once b is
// in the pool or gone: a session that closes meanwhile finds it there
// (drop) or finds it gone.
func (p *warmPool) keep(rs *Session, key string, b *box) {
	rs.mu.Lock()
	p.mu.Lock()
	ok := !rs.closed && !p.closed && p.max > 0 && p.entries[rs] == nil &&
		(len(p.entries) < p.max || p.evictLocked())
	w := &warmRun{key: key, since: time.Now(), ready: make(chan struct{})}
	if ok {
		p.entries[rs] = w
		p.wg.Add(1)
	}
	p.mu.Unlock()
	rs.mu.Unlock()
	if !ok {
		b.end()
		return
	}
	go func() {
		defer p.wg.Done()
		err := b.r.Again() // on an error the run is ended
		p.mu.Lock()
		if err == nil {
			w.b = b
			p.kept.Add(1)
		} else {
			w.err = err
		}
		if err == nil && p.entries[rs] == w {
			w.timer = time.AfterFunc(warmIdle, func() { p.expire(rs, w) })
		}
		// Whoever took it from the map meanwhile (a run, drop, close)
		// waits for ready and disposes of it.
		close(w.ready)
		p.mu.Unlock()
	}()
}

// evictLocked drops the oldest kept sandbox to make room; it reports false
// when every entry is still being readied.
func (p *warmPool) evictLocked() bool {
	var oldest *Session
	for rs, w := range p.entries {
		select {
		case <-w.ready:
		default:
			continue
		}
		if oldest == nil || w.since.Before(p.entries[oldest].since) {
			oldest = rs
		}
	}
	if oldest == nil {
		return false
	}
	w := p.entries[oldest]
	delete(p.entries, oldest)
	if w.timer != nil {
		w.timer.Stop()
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.discard(w) }()
	return true
}

func (p *warmPool) expire(rs *Session, w *warmRun) {
	p.mu.Lock()
	mine := p.entries[rs] == w
	if mine {
		delete(p.entries, rs)
	}
	p.mu.Unlock()
	if mine {
		p.discard(w)
	}
}

// drop kills rs's kept sandbox, if any, and waits for it to end; the
// caller has closed rs, so none comes after.
func (p *warmPool) drop(rs *Session) {
	p.mu.Lock()
	w := p.entries[rs]
	delete(p.entries, rs)
	p.mu.Unlock()
	if w == nil {
		return
	}
	<-w.ready
	p.discard(w)
}

// discard ends a kept sandbox that will not be used.
func (p *warmPool) discard(w *warmRun) {
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.b != nil {
		p.discarded.Add(1)
		w.b.end()
	}
}

// size is how many sandboxes are kept or being readied.
func (p *warmPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries)
}

// close drops every kept sandbox and waits for those being readied.
func (p *warmPool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.entries
	p.entries = map[*Session]*warmRun{}
	p.mu.Unlock()
	for _, w := range all {
		<-w.ready
		p.discard(w)
	}
	p.wg.Wait()
}
