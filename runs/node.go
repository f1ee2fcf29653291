// Package runs is condfs run, the daemon's side (docs/sandbox.md): a run
// is decided (the policy's tool `exec`), built (package sandbox), kept live
// (the binaries its session's context allows, on every switch and reload
// before they return), and ended with its session. Its sandbox may be kept
// for its session's next run (warm.go), and a run whose [sandbox] network
// is "policy" goes out through an egress gateway of its own (egress.go,
// inspect.go), which this package owns with the sandbox it serves.
//
// The daemon (package daemon) owns the sessions, their views and their
// switch locks; it gives each session's runs a Session, and calls Allow,
// Narrow and Recheck as contexts and rules change.
//
// Locks, and the order they are taken in (a lock may be taken while
// holding one above it, never one below):
//
//	the session's switch lock    (the daemon's: every change of a run's allowlist is made under it)
//	Session.mu                   its runs, closed, lastRun
//	warmPool.mu                  the kept sandboxes (warm.go)
//	activeRun.mu                 why the daemon ended a run
//	Session.egressMu             its egress share, made at its first policy run
//	authority.mu, authority.rootsMu   the egress CA, and the roots of inspected hosts (inspect.go)
//
// The last three take no other lock of the list while held. The switch
// lock is held across a run's Allow and a command's Begin (each waits for
// the run's init), so that a run never holds binaries its context no
// longer allows; no lock is held across a sandbox's build, and the others
// never across a wait for a run.
package runs

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/constraints"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/egress"
	"github.com/condfs/condfs/fsys"
	"github.com/condfs/condfs/sandbox"
)

// Config is what the runs take from the daemon.
type Config struct {
	Log *slog.Logger
	// Conditions and Policy are the config snapshots in force at each call.
	Conditions func() *acl.Config
	Policy     func() *constraints.Policy
	// Lookup finds the session a caller names, or the error its caller
	// gets (unknown, another user's).
	Lookup func(ctx context.Context, id string) (*Session, *control.Error)
	// Decide is the daemon's tool.decide: a run is first the tool call
	// exec, decided, counted and audited as any.
	Decide func(ctx context.Context, params json.RawMessage) (any, *control.Error)
	// AuditRun and AuditConnect write a run's end and each decision of
	// its gateway.
	AuditRun     func(Ended)
	AuditConnect func(session string, atoms []string, e egress.Event)
	// EgressCapture is how runs whose network is "policy" reach their
	// gateway (sandbox.CaptureKernel, sandbox.CaptureNetstack, or
	// sandbox.CaptureAuto).
	EgressCapture string
	// StateDir holds the egress CA; "" keeps it in memory.
	StateDir string
	// WarmRuns bounds the sandboxes kept for sessions' next runs
	// (warm.go); 0 builds each run's when it comes.
	WarmRuns int
	// FileLimit is the daemon's limit of open descriptors, which bounds
	// the node's egress connections (nodeConnections).
	FileLimit uint64
}

// Ended is a run that has ended, as its audit record tells it.
type Ended struct {
	Session string
	Atoms   []string
	Argv    []string
	Cwd     string
	Exit    int
	Reason  string // why the daemon ended it, or ""
	Took    time.Duration
}

// Node is what every session's runs share: the kept sandboxes, the node's
// egress connections and the egress CA.
type Node struct {
	cfg         Config
	log         *slog.Logger
	warm        *warmPool
	egressPool  *egress.Pool
	egressStack atomic.Pointer[string] // the capture the last gateway got
	ca          authority
}

// New makes the node's runs.
func New(cfg Config) *Node {
	return &Node{cfg: cfg, log: cfg.Log, warm: newWarmPool(cfg.WarmRuns),
		egressPool: egress.NewPool(nodeConnections(cfg.FileLimit))}
}

// ReservedFDs is what the runs' egress connections may hold of the
// daemon's descriptors at most (fsys.HostOptions.ReservedFDs).
func (n *Node) ReservedFDs() int { return n.egressPool.Max() * egressFDs }

// Close drops every kept sandbox and waits for those being readied.
func (n *Node) Close() { n.warm.close() }

// Status is status.runs: the kept sandboxes and how runs started.
func (n *Node) Status() map[string]any { return n.warm.status() }

// Session is one session's runs; closed once the session closes (no run
// starts after).
type Session struct {
	id    string
	owner uint32
	view  *fsys.View
	// switchMu is the session's switch lock: every change of a run's
	// allowlist is made under it (context.set, reload, a run's begin).
	switchMu *sync.Mutex

	mu     sync.Mutex
	set    map[*activeRun]struct{}
	closed bool
	wg     sync.WaitGroup
	// lastRun is when its last run began (warm.go)
	lastRun time.Time

	egressMu sync.Mutex
	egress   *egress.Share // its runs' egress connections together (egress.go)
}

// Session gives the runs of the session id, whose view serves owner;
// switchMu is its switch lock.
func (n *Node) Session(id string, owner uint32, view *fsys.View, switchMu *sync.Mutex) *Session {
	return &Session{id: id, owner: owner, view: view, switchMu: switchMu}
}

// End kills every run of s and waits until each has ended, then drops its
// kept sandbox (it holds a clone of the view): nothing of the session's
// runs outlives it, and none starts after.
func (n *Node) End(s *Session) {
	s.closeAll()
	n.warm.drop(s)
}

// Allow tells each run of s which binaries its context allows now, and
// decides its connections again; the caller holds s's switch lock.
func (n *Node) Allow(s *Session, cfg *acl.Config, set cctx.Set) {
	for _, a := range s.list() {
		if err := a.box.r.Allow(allowedBinaries(cfg, set, a.binaries)); err != nil {
			// A run whose allowlist cannot follow its context cannot go
			// on (sandbox kills it; a run that has just ended reports
			// this too).
			n.log.Info("run: its binaries not updated; it is ended", "session", s.id, "err", err)
			a.box.r.Kill()
		}
		a.box.recheck()
	}
}

// Recheck decides every open connection of s's runs again (the policy
// changed); the caller holds s's switch lock.
func (n *Node) Recheck(s *Session) {
	for _, a := range s.list() {
		a.box.recheck()
	}
}

// Narrow takes from each run of s, before its view moves from the rules
// and context (oldCfg, old) to (cfg, set), the binaries the latter will
// not allow; those it adds come with Allow, once the view has moved. A
// view directory allowed as a whole must not stay bound executable while
// the view already shows what the new rules or context show beneath it. A
// run that cannot follow is ended. The caller holds s's switch lock.
func (n *Node) Narrow(s *Session, oldCfg *acl.Config, old cctx.Set, cfg *acl.Config, set cctx.Set) {
	for _, a := range s.list() {
		before := allowedBinaries(oldCfg, old, a.binaries)
		after := allowedBinaries(cfg, set, a.binaries)
		keep := slices.DeleteFunc(slices.Clone(before), func(name string) bool { return !slices.Contains(after, name) })
		if len(keep) == len(before) {
			continue
		}
		if err := a.box.r.Allow(keep); err != nil {
			n.log.Info("run: its binaries not updated; it is ended", "session", s.id, "err", err)
			a.box.r.Kill()
		}
	}
}

// box is a run's sandbox with the gateway that serves its network (nil
// for a run without one); a kept sandbox keeps its gateway.
type box struct {
	r  *sandbox.Run
	gw *egress.Gateway
}

// recheck decides every open connection of b's gateway again.
func (b *box) recheck() {
	if b.gw != nil {
		b.gw.Recheck()
	}
}

// end kills b's run and waits until it is gone (its gateway closes with
// it).
func (b *box) end() {
	b.r.Kill()
	b.r.Gone()
}

// activeRun is one run of a session.
type activeRun struct {
	box      *box
	binaries []string // [sandbox] binaries when it started
	inRow    bool     // its session runs commands in a row: its sandbox is kept (warm.go)
	mu       sync.Mutex
	reason   string // why the daemon ended it: "timeout", "closed", "gone"
}

func (a *activeRun) end(reason string) {
	a.mu.Lock()
	if a.reason == "" {
		a.reason = reason
	}
	a.mu.Unlock()
	a.box.r.Kill()
}

func (s *Session) add(a *activeRun) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.set == nil {
		s.set = map[*activeRun]struct{}{}
	}
	s.set[a] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Session) remove(a *activeRun) {
	s.mu.Lock()
	delete(s.set, a)
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Session) list() []*activeRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*activeRun, 0, len(s.set))
	for a := range s.set {
		out = append(out, a)
	}
	return out
}

// closeAll kills every run and waits until each has ended.
func (s *Session) closeAll() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for _, a := range s.list() {
		a.end("closed")
	}
	s.wg.Wait()
}
