// Package daemon is condfs serve: sessions and their views, the config
// snapshots and their hot reload, the audit log, and the control-socket
// methods that tie them together (docs/control.md).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/changes"
	"github.com/condfs/condfs/constraints"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/fsys"
	"github.com/condfs/condfs/metrics"
	"github.com/condfs/condfs/runs"
	"github.com/condfs/condfs/sandbox"
)

// Version is reported by status.
var Version = "0.1.0"

// Config is what condfs serve was started with.
type Config struct {
	Conditions     string
	Policy         string
	BlocksDir      string
	Memories       string
	Workspace      string
	Socket         string
	SocketMode     os.FileMode
	SocketGroup    int
	AllowUIDs      []uint32
	AllowOther     bool
	AllowHardlinks bool
	// NoStagedWatch turns off the watch that mounts a staged layer afresh
	// when names change beneath its backing tree (changes.BackingWatch):
	// a staged view is then mounted afresh at commits, discards and
	// rollbacks only, and shows what it first saw of a backing entry
	// another writer replaced between them (docs/changes.md).
	NoStagedWatch bool
	// MountRoot is where peers other than root and the daemon's uid may
	// have the daemon create their mountpoints (default /run/condfs/views).
	MountRoot string
	// MaxConns bounds the socket's connections (default 1024);
	// MaxConnsPerUID bounds each uid other than root and the daemon's
	// (default MaxConns/8). See control.Options.
	MaxConns       int
	MaxConnsPerUID int
	// HubDir, if set, is where a root daemon mounts the one FUSE
	// connection that serves every session (fsys.HostOptions); each view is then a
	// bind mount of it. "" mounts a connection per session.
	HubDir string
	// MaxSessions bounds the open sessions; 0 derives it from the
	// daemon's limits (DefaultMaxSessions). An eighth of them only root
	// and the daemon's uid may open, and MaxSessionsPerUID (default
	// MaxSessions/8) bounds the sessions each other uid has opened.
	MaxSessions       int
	MaxSessionsPerUID int
	// WarmRuns bounds the sandboxes kept for sessions' next runs
	// (runs/warm.go); 0 builds each run's when it comes.
	WarmRuns int
	// EgressCapture is how runs whose network is "policy" reach their
	// gateway: sandbox.CaptureKernel, sandbox.CaptureNetstack, or
	// CaptureAuto (the kernel's where it has nftables NAT).
	EgressCapture string
	// StateDir holds sessions.json, the sessions restored after a crash;
	// "" keeps no state.
	StateDir string
	// CacheTTL is how long the kernel may cache entries and attributes no
	// rule governs, kept true to the backing trees by inotify (fsys.Watcher);
	// a second or less caches everything for a second, with no watcher.
	CacheTTL time.Duration
	// Metrics, if set, is where Prometheus metrics are served: a Unix
	// socket path or a loopback host:port.
	Metrics string
	// FirstMount and FirstContext open a first session "default" before
	// the socket accepts anyone, so that a client that can connect can
	// also rely on the view.
	FirstMount   string
	FirstContext cctx.Set
	Logger       *slog.Logger // operational log
	Audit        *slog.Logger // audit records
	Debounce     time.Duration
}

// Daemon is a running condfs.
//
// Locks, in the order they may be taken (one may be taken while holding
// those above it, never one below). None is held across a mount, an
// unmount or a run's build:
//
//	Daemon.reloadMu     one reload at a time (Reload)
//	configFile.mu       a config file's reload and status (config.go); a
//	                    reload's replacing hook runs under it
//	session.switchMu    one context switch at a time, and every change of
//	                    its runs' allowlists; runs/node.go's table goes on
//	                    from here, and fsys/host.go's (the switch moves the
//	                    view under it)
//	session.stateMu     its state file (state.go)
//	session.changesMu   the first open of its checkpoint store, against its
//	                    close (changes.go)
//	Daemon.mu           the registry: sessions and mounts. Held briefly, for
//	                    lookups and what status reads of the views; no lock
//	                    of this list is taken under it
//	denialLimiter.mu    the audit's memory of records (audit.go); a leaf
//
// A session's switch lock is never taken while holding Daemon.mu: a
// reload lists the sessions, lets go, then takes each one's.
type Daemon struct {
	cfg        Config
	log        *slog.Logger
	audit      *slog.Logger
	conditions *configFile[acl.Config]
	// replaced: the rules a reload is replacing, from just before the
	// swap until every run follows the new ones; the views keep what they
	// list for runs read-only meanwhile (fsys Options.Replaced).
	replaced    atomic.Pointer[acl.Config]
	policy      *configFile[constraints.Policy]
	server      *control.Server
	metrics     *metrics.Metrics // nil: off
	stopMetrics func()
	host        *fsys.Host // what the views share: watcher, hub, backings

	mu       sync.Mutex
	sessions map[string]*session
	mounts   map[string]string // mountpoint -> session id, of d.sessions
	reloadMu sync.Mutex
	// restoreErrors are the sessions the state file named that could not
	// be restored at start.
	restoreErrors []string
	restored      int // sessions restored at start
	closing       atomic.Bool
	denials       denialLimiter
	allowed       denialLimiter // identical allowed decisions, collapsed as denials are (audit.go)
	runs          *runs.Node    // what the sessions' runs share: kept sandboxes, egress pool and CA
	largeDecides  chan struct{} // a token per large tool.decide being decoded
	changesHeld   sync.Map      // uid → *atomic.Int64: what its sessions' checkpoints hold (changes.go)
	// stagedWatch tells staged layers of changes in their backing trees;
	// made with the first staged session (changes.go).
	stagedWatchMu   sync.Mutex
	stagedWatchOnce sync.Once // the warning that an unprivileged daemon has no watch
	stagedWatch     *changes.BackingWatch

	stopWatch func()
}

type session struct {
	id        string
	mount     string
	peer      uint32 // who opened it
	owner     uint32
	allowUIDs []uint32
	view      *fsys.View // nil while the session is being opened

	runs      *runs.Session // its condfs runs; nil while the session is being opened
	switchMu  sync.Mutex    // one context switch at a time
	stateMu   sync.Mutex
	stateSize int // its state file's size (state.go); 0 before the first write

	// changes holds its checkpoints (changes.go): nil until the first
	// checkpoint.create, so a session that never checkpoints holds no
	// descriptor and no directory for them. changesMu orders that first
	// open against the session's close.
	changesMu     sync.Mutex
	changes       atomic.Pointer[changes.Store]
	changesClosed bool // guarded by changesMu
	// mode is "direct" or "staged"; layer holds a staged session's
	// changes (changes.go), set before its view is mounted.
	mode  string
	layer *changes.Layer
}

// validSessionID: 1 to 64 of A-Z a-z 0-9 _ . - (a regexp with {1,64}
// would cost every start of the binary its compilation), and not "." or
// "..": an id names the session's directory under STATE_DIR/changes, which
// a new session clears first.
func validSessionID(id string) bool {
	if len(id) == 0 || len(id) > 64 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// withDefaults checks what New cannot start without and fills in what
// was left unset.
func (cfg Config) withDefaults() (Config, error) {
	switch cfg.EgressCapture {
	case sandbox.CaptureAuto, sandbox.CaptureKernel, sandbox.CaptureNetstack:
	default:
		return cfg, fmt.Errorf("egress capture %q: want kernel, netstack or empty (the kernel's where it can)", cfg.EgressCapture)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Audit == nil {
		cfg.Audit = cfg.Logger
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = 50 * time.Millisecond
	}
	if cfg.MountRoot == "" {
		cfg.MountRoot = "/run/condfs/views"
	}
	return cfg, nil
}

// New loads the config files (a file that fails to load is an error) and
// opens the control socket.
func New(cfg Config) (*Daemon, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Raised first: the views' open files and the runs' egress
	// connections are bounded by the limit the daemon will have.
	RaiseFileLimit()
	d := &Daemon{
		cfg: cfg, log: cfg.Logger, audit: cfg.Audit,
		conditions: newConditions(cfg.Conditions),
		policy:     newPolicy(cfg.Policy),
		sessions:   map[string]*session{}, mounts: map[string]string{},
		largeDecides: make(chan struct{}, largeDecides),
	}
	d.runs = runs.New(runs.Config{
		Log: d.log, Conditions: d.conditions.Load, Policy: d.policy.Load,
		Lookup: d.sessionRuns, Decide: d.decide, AuditRun: d.auditRun, AuditConnect: d.auditConnect,
		EgressCapture: cfg.EgressCapture, StateDir: cfg.StateDir, WarmRuns: cfg.WarmRuns, FileLimit: fileLimit(),
	})
	d.conditions.replacing = func(old, cfg *acl.Config) {
		d.replaced.Store(old)
		for _, s := range d.sessionsWithViews() {
			s.switchMu.Lock()
			d.runs.Narrow(s.runs, old, s.view.Context(), cfg, s.view.Context())
			s.switchMu.Unlock()
		}
	}
	if err := d.conditions.initial(); err != nil {
		return nil, err
	}
	if err := d.policy.initial(); err != nil {
		return nil, err
	}
	if d.conditions.Load().Sandbox() != nil && sandbox.Probe().Build != "" {
		// Runs are configured: index the host's programs now rather
		// than at the first run.
		sandbox.IndexPrograms()
	}
	for _, w := range d.policy.Load().Warnings() {
		d.log.Warn("policy lint", "warning", w.String())
	}
	for _, dir := range []string{cfg.Memories, cfg.Workspace} {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("backing directory %s: must exist and be a directory", dir)
		}
	}
	d.denials.init()
	d.allowed.init()
	// Before anything is mounted or restored: a second daemon on the
	// same socket must leave the first one's mounts and state alone.
	if err := control.Live(cfg.Socket); err != nil {
		return nil, err
	}
	// One cleanup stack: whatever step fails, everything started before
	// it is stopped, in reverse order.
	var undo []func()
	started := false
	defer func() {
		for i := len(undo) - 1; i >= 0 && !started; i-- {
			undo[i]()
		}
	}()
	if err := d.startParts(&undo); err != nil {
		return nil, err
	}
	srv, err := control.Listen(control.Options{
		Path: cfg.Socket, Mode: cfg.SocketMode, Group: cfg.SocketGroup, AllowUIDs: cfg.AllowUIDs,
		Handler: d.handle, Logger: d.log, MaxConns: cfg.MaxConns, MaxConnsPerUID: cfg.MaxConnsPerUID,
		OnConn: d.metrics.Conn, OnError: d.metrics.SocketError,
	})
	if err != nil {
		return nil, err
	}
	d.server = srv
	undo = append(undo, func() { srv.Close() })
	stop, err := d.watch()
	if err != nil {
		return nil, err
	}
	d.stopWatch = stop
	started = true
	return d, nil
}

// startParts starts the metrics server, the watcher, the hub and the
// sessions (the first one, those restored), pushing on undo what stops
// each.
func (d *Daemon) startParts(undo *[]func()) error {
	cfg := d.cfg
	if cfg.Metrics != "" {
		d.metrics = metrics.New(d.openSessions, d.panics)
		d.metrics.RegisterConfig("conditions", d.conditions.genAndTime)
		d.metrics.RegisterConfig("policy", d.policy.genAndTime)
		stop, err := d.metrics.Serve(context.Background(), cfg.Metrics, d.log)
		if err != nil {
			return err
		}
		d.stopMetrics = stop
		*undo = append(*undo, func() { stop(); d.stopMetrics = nil })
	}
	host, err := fsys.NewHost(fsys.HostOptions{CacheTTL: cfg.CacheTTL, HubDir: cfg.HubDir, Logger: d.log, Observe: d.fuseObserver(),
		ReservedFDs: d.runs.ReservedFDs()})
	if err != nil {
		return err
	}
	d.host = host
	*undo = append(*undo, func() { d.closeHost() })
	if n := FitThreadLimit(); n > 0 {
		d.log.Info("thread limit fitted to the cgroup's pids limit", "max_threads", n)
	}
	if d.cfg.MaxSessions <= 0 {
		d.cfg.MaxSessions = DefaultMaxSessions(d.host.Shared())
	}
	if d.cfg.MaxSessionsPerUID <= 0 {
		d.cfg.MaxSessionsPerUID = max(1, d.cfg.MaxSessions/8)
	}
	*undo = append(*undo, func() { d.closeSessions() })
	if cfg.FirstMount != "" {
		self := uint32(os.Geteuid())
		if _, cerr := d.OpenSession(openRequest{peer: self, id: "default", mount: cfg.FirstMount, atoms: cfg.FirstContext, owner: self}); cerr != nil {
			return fmt.Errorf("first session: %s", cerr.Message)
		}
	}
	d.restoreState()
	if d.restored > 0 {
		// Descriptors opened through the views before the crash (or stop)
		// are on a connection that is gone, and nothing can cut them off:
		// the kernel reads their cached pages until their attributes lapse
		// (a ruled file's last fsys.DefaultAttrTimeout). No switch is
		// taken before they have.
		time.Sleep(fsys.DefaultAttrTimeout)
	}
	return nil
}

// Serve serves the control socket until Close.
func (d *Daemon) Serve() error { return d.server.Serve() }

// Close unmounts every view, stops the watcher and removes the socket. The
// state file keeps the sessions: a clean restart (an upgrade, systemctl
// restart) brings them back as a crash would.
func (d *Daemon) Close() error {
	d.closing.Store(true)
	var errs []error
	if d.stopWatch != nil {
		d.stopWatch()
	}
	errs = append(errs, d.server.Close())
	d.runs.Close()
	errs = append(errs, d.closeAll())
	d.stagedWatchMu.Lock()
	if d.stagedWatch != nil {
		d.stagedWatch.Close()
		d.stagedWatch = nil
	}
	d.stagedWatchMu.Unlock()
	d.flushAllCounts() // the sessions told theirs as they closed
	if d.stopMetrics != nil {
		d.stopMetrics()
	}
	return errors.Join(errs...)
}

// closeAll unmounts every view, then stops what they shared.
func (d *Daemon) closeAll() error {
	return errors.Join(d.closeSessions(), d.closeHost())
}

// closeSessions closes every session.
func (d *Daemon) closeSessions() error {
	d.mu.Lock()
	ids := make([]string, 0, len(d.sessions))
	for id := range d.sessions {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, d.closeSession(id))
	}
	return errors.Join(errs...)
}

func (d *Daemon) closeHost() error {
	if d.host == nil {
		return nil
	}
	err := d.host.Close()
	d.host = nil
	return err
}

// openRequest is a session.open: who asks, and what.
type openRequest struct {
	peer      uint32 // the socket peer's uid
	id, mount string
	atoms     cctx.Set
	owner     uint32   // the uid the view serves
	allowUIDs []uint32 // other uids let in
	restored  bool     // from the state directory: its checkpoints are kept
	changes   string   // "direct" or "staged"
}

// privileged reports whether a peer may act for others: root and the
// daemon's own uid.
func privileged(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }

// OpenSession mounts a view for a new session. No lock is held across the
// checks of the mountpoint or the mount itself: a mountpoint that hangs (a
// FUSE filesystem that never answers) delays only this request.
func (d *Daemon) OpenSession(r openRequest) (*fsys.View, *control.Error) {
	if !validSessionID(r.id) {
		return nil, control.Errorf(control.CodeInvalidParams, "session id %q: use 1 to 64 of A-Z a-z 0-9 _ . - (not . or ..)", r.id)
	}
	if !filepath.IsAbs(r.mount) {
		return nil, control.Errorf(control.CodeInvalidParams, "mount %q must be an absolute path (ctl makes relative paths absolute)", r.mount)
	}
	mount := filepath.Clean(r.mount)
	d.mu.Lock()
	if _, ok := d.sessions[r.id]; ok {
		d.mu.Unlock()
		return nil, control.Errorf(control.CodeSessionExists, "session %q is already open; close it first or pick another id", r.id)
	}
	if id, ok := d.mounts[mount]; ok {
		d.mu.Unlock()
		return nil, control.Errorf(control.CodeSessionExists, "session %q already has %s mounted", id, mount)
	}
	if err := d.sessionRoom(r.peer); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	// Reserve the id and the mountpoint while mounting, outside the lock.
	reserved := &session{id: r.id, mount: mount, peer: r.peer, owner: r.owner, allowUIDs: r.allowUIDs, mode: r.changes}
	d.sessions[r.id] = reserved
	d.mounts[mount] = r.id
	d.mu.Unlock()
	cerr := d.openLayer(reserved, r.restored)
	var v *fsys.View
	if cerr == nil {
		v, cerr = d.mountView(r, mount, reserved.layer)
		if cerr != nil {
			d.closeLayer(reserved, !r.restored)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cerr != nil {
		delete(d.sessions, r.id)
		delete(d.mounts, mount)
		return nil, cerr
	}
	s := d.sessions[r.id]
	s.view = v
	if s.layer != nil {
		v.SetChanges(changes.LayerRecorder{Layer: s.layer})
		s.layer.SetRemount(v.RemountSpaces)
	}
	s.runs = d.runs.Session(r.id, r.owner, v, &s.switchMu)
	d.log.Info("session opened", "session", r.id, "mount", mount, "owner", r.owner, "atoms", r.atoms.Atoms())
	d.mu.Unlock()
	d.saveSession(s, r.atoms)
	d.openChanges(s, r.restored)
	d.mu.Lock()
	return v, nil
}

func (d *Daemon) closeSession(id string) error {
	d.mu.Lock()
	s, ok := d.sessions[id]
	if ok && s.view != nil {
		delete(d.sessions, id)
		delete(d.mounts, s.mount)
	}
	d.mu.Unlock()
	if !ok || s.view == nil {
		return nil
	}
	// No process outlives its session's authority: the runs end first.
	d.runs.End(s.runs)
	err := s.view.Unmount()
	d.closeChanges(s, !d.closing.Load())
	d.closeLayer(s, !d.closing.Load())
	d.log.Info("session closed", "session", id, "err", err)
	d.flushCounts(id, s.view.Context().Atoms())
	d.dropSession(s, !d.closing.Load())
	return err
}

// session finds a session for a peer: a session belongs to the uid that
// opened it (or the owner named then), and other uids but root and the
// daemon's own get -32011 for it.
func (d *Daemon) session(ctx context.Context, id string) (*session, *control.Error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[id]
	if !ok || s.view == nil {
		return nil, control.Errorf(control.CodeUnknownSession, "unknown session %q: open it with session.open, or list them with session.list", id)
	}
	if peer, known := control.PeerUID(ctx); known && !privileged(peer) && peer != s.owner {
		return nil, control.Errorf(control.CodeNotOwner, "session %q belongs to another user", id)
	}
	return s, nil
}

// sessionRuns finds the runs of a session for a peer, as session does.
func (d *Daemon) sessionRuns(ctx context.Context, id string) (*runs.Session, *control.Error) {
	s, err := d.session(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.runs, nil
}

// sessionRoom says whether peer may open one more session (d.mu held).
// One uid opening sessions must not take the room of every other: as for
// the socket's connections, an eighth is kept for root and the daemon's
// uid, and each other uid holds at most MaxSessionsPerUID of those it
// opened.
func (d *Daemon) sessionRoom(peer uint32) *control.Error {
	n, most := len(d.sessions), d.cfg.MaxSessions
	if n >= most {
		return control.Errorf(control.CodeBusy, "too many sessions: %d are open, the most this daemon serves (--max-sessions); close one first", n)
	}
	if privileged(peer) {
		return nil
	}
	if n >= most-most/8 {
		return control.Errorf(control.CodeBusy, "too many sessions: %d are open, and the rest of --max-sessions (%d) is kept for root and the daemon's uid; close one first", n, most)
	}
	mine := 0
	for _, s := range d.sessions {
		if s.peer == peer {
			mine++
		}
	}
	if mine >= d.cfg.MaxSessionsPerUID {
		return control.Errorf(control.CodeBusy, "uid %d has opened %d sessions, the most one uid may (--max-sessions-per-uid); close one first", peer, mine)
	}
	return nil
}

func outcome(changed bool, err error) string {
	switch {
	case err != nil:
		return "error"
	case changed:
		return "ok"
	}
	return "unchanged"
}

// Reload re-reads both config files now (with force, even if unchanged)
// and invalidates every view after a swap. It returns the config status.
func (d *Daemon) Reload(force bool) map[string]FileStatus {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	oldRules := d.conditions.Load()
	condChanged, err := d.conditions.reload(force)
	d.metrics.Reload("conditions", outcome(condChanged, err))
	if err != nil {
		d.log.Error("conditions reload failed; last good config stays", "err", err)
	}
	polChanged, err := d.policy.reload(force)
	d.metrics.Reload("policy", outcome(polChanged, err))
	if err != nil {
		d.log.Error("policy reload failed; last good policy stays", "err", err)
	}
	if polChanged && !condChanged {
		// The policy decides the runs' connections: each is decided again.
		for _, s := range d.sessionsWithViews() {
			s.switchMu.Lock()
			d.runs.Recheck(s.runs)
			s.switchMu.Unlock()
		}
	}
	if condChanged {
		for _, s := range d.sessionsWithViews() {
			if err := s.view.Invalidate(oldRules); err != nil {
				d.log.Warn("invalidate view", "mount", s.view.Mountpoint(), "err", err)
			}
			s.switchMu.Lock()
			d.runs.Allow(s.runs, d.conditions.Load(), s.view.Context())
			s.switchMu.Unlock()
		}
		d.replaced.Store(nil) // every run follows the new rules now
		d.log.Info("conditions reloaded", "generation", d.conditions.status().Generation)
	}
	return d.configStatus()
}

// sessionsWithViews lists the sessions whose views are mounted.
func (d *Daemon) sessionsWithViews() []*session {
	d.mu.Lock()
	defer d.mu.Unlock()
	sessions := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		if s.view != nil {
			sessions = append(sessions, s)
		}
	}
	return sessions
}

// fuseObserver times FUSE requests for the metrics, or nil when they are
// off (the views then skip the clock).
func (d *Daemon) fuseObserver() func(string, time.Time) {
	if d.metrics == nil {
		return nil
	}
	return d.metrics.FUSEOp
}

func (d *Daemon) openSessions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

// limits: how many sessions are open, how many may be, and how views are
// served.
func (d *Daemon) limits() map[string]any {
	d.mu.Lock()
	n := len(d.sessions)
	d.mu.Unlock()
	conns := "per-session"
	if d.host.Shared() {
		conns = "shared"
	}
	return map[string]any{"sessions_open": n, "max_sessions": d.cfg.MaxSessions, "connections": conns}
}

// panics counts the requests that panicked and failed closed: control
// methods, and FUSE operations of the views open now.
func (d *Daemon) panics() map[string]int64 {
	var fuseOps int64
	d.mu.Lock()
	for _, s := range d.sessions {
		if s.view != nil {
			fuseOps += s.view.Panics()
		}
	}
	d.mu.Unlock()
	fuseOps += d.host.Panics()
	var socket int64
	if d.server != nil {
		socket = d.server.Panics()
	}
	return map[string]int64{"control": socket, "fuse": fuseOps}
}

func (d *Daemon) configStatus() map[string]FileStatus {
	return map[string]FileStatus{"conditions": d.conditions.status(), "policy": d.policy.status()}
}

type sessionInfo struct {
	ID          string   `json:"id"`
	Mount       string   `json:"mount"`
	Owner       uint32   `json:"owner"`
	Atoms       []string `json:"atoms"`
	DaemonReads int64    `json:"daemon_reads"`
	// Changes is what its checkpoints hold (changes.go).
	Changes *changes.Use `json:"changes,omitempty"`
}

func (d *Daemon) sessionList(ctx context.Context) []sessionInfo {
	peer, known := control.PeerUID(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []sessionInfo{}
	for _, s := range d.sessions {
		if s.view == nil || (known && !privileged(peer) && peer != s.owner) {
			continue
		}
		out = append(out, sessionInfo{ID: s.id, Mount: s.mount, Owner: s.owner, Atoms: s.view.Context().Atoms(), DaemonReads: s.view.DaemonReads(), Changes: changesUse(s)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
