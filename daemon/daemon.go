// Package daemon is condfs serve: sessions and their views, the config
// snapshots and their hot reload, the audit log, and the control-socket
// methods that tie them together (spec/control.md).
package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/constraints"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/fsys"
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
type Daemon struct {
	cfg        Config
	log        *slog.Logger
	audit      *slog.Logger
	conditions *configFile[acl.Config]
	policy     *configFile[constraints.Policy]
	server     *control.Server

	mu       sync.Mutex
	sessions map[string]*session
	reloadMu sync.Mutex

	stopWatch func()
}

type session struct {
	id   string
	view *fsys.View
}

var sessionIDRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// New loads the config files (a file that fails to load is an error) and
// opens the control socket.
func New(cfg Config) (*Daemon, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Audit == nil {
		cfg.Audit = cfg.Logger
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = 50 * time.Millisecond
	}
	d := &Daemon{
		cfg: cfg, log: cfg.Logger, audit: cfg.Audit,
		conditions: newConditions(cfg.Conditions),
		policy:     newPolicy(cfg.Policy),
		sessions:   map[string]*session{},
	}
	if err := d.conditions.initial(); err != nil {
		return nil, err
	}
	if err := d.policy.initial(); err != nil {
		return nil, err
	}
	for _, w := range d.policy.Load().Warnings() {
		d.log.Warn("policy lint", "warning", w.String())
	}
	for _, dir := range []string{cfg.Memories, cfg.Workspace} {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("backing directory %s: must exist and be a directory", dir)
		}
	}
	if cfg.FirstMount != "" {
		if _, cerr := d.OpenSession("default", cfg.FirstMount, cfg.FirstContext); cerr != nil {
			return nil, fmt.Errorf("first session: %s", cerr.Message)
		}
	}
	srv, err := control.Listen(control.Options{
		Path: cfg.Socket, Mode: cfg.SocketMode, Group: cfg.SocketGroup, AllowUIDs: cfg.AllowUIDs,
		Handler: d.handle, Logger: d.log,
	})
	if err != nil {
		d.closeSession("default")
		return nil, err
	}
	d.server = srv
	stop, err := d.watch()
	if err != nil {
		srv.Close()
		d.closeSession("default")
		return nil, err
	}
	d.stopWatch = stop
	return d, nil
}

// Serve serves the control socket until Close.
func (d *Daemon) Serve() error { return d.server.Serve() }

// Close unmounts every view, stops the watcher and removes the socket.
func (d *Daemon) Close() error {
	var errs []error
	if d.stopWatch != nil {
		d.stopWatch()
	}
	errs = append(errs, d.server.Close())
	d.mu.Lock()
	ids := make([]string, 0, len(d.sessions))
	for id := range d.sessions {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	for _, id := range ids {
		errs = append(errs, d.closeSession(id))
	}
	return errors.Join(errs...)
}

// OpenSession mounts a view for a new session.
func (d *Daemon) OpenSession(id, mount string, set cctx.Set) (*fsys.View, *control.Error) {
	if !sessionIDRe.MatchString(id) {
		return nil, control.Errorf(control.CodeInvalidParams, "session id %q: use 1 to 64 of A-Z a-z 0-9 _ . -", id)
	}
	if !filepath.IsAbs(mount) {
		return nil, control.Errorf(control.CodeInvalidParams, "mount %q must be an absolute path", mount)
	}
	mount = filepath.Clean(mount)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.sessions[id]; ok {
		return nil, control.Errorf(control.CodeSessionExists, "session %q is already open; close it first or pick another id", id)
	}
	for _, s := range d.sessions {
		if s.view.Mountpoint() == mount {
			return nil, control.Errorf(control.CodeSessionExists, "session %q already has %s mounted", s.id, mount)
		}
	}
	if err := fsys.ClearStale(mount); err != nil {
		return nil, control.Errorf(control.CodeMount, "%v", err)
	}
	if err := os.MkdirAll(mount, 0o755); err != nil {
		return nil, control.Errorf(control.CodeMount, "create mountpoint: %v", err)
	}
	v, err := fsys.Mount(fsys.Options{
		Mountpoint: mount, Memories: d.cfg.Memories, Workspace: d.cfg.Workspace,
		Rules: d.conditions, Context: set,
		AllowHardlinks: d.cfg.AllowHardlinks, AllowOther: d.cfg.AllowOther,
		Logger: d.log,
		OnDeny: func(ctx cctx.Set, sp acl.Space, p, op string) {
			d.audit.Info("deny", "kind", "path", "session", id, "atoms", ctx.Atoms(), "space", sp.String(), "path", p, "op", op, "decision", "deny")
		},
	})
	if err != nil {
		return nil, control.Errorf(control.CodeMount, "mount %s: %v", mount, err)
	}
	d.sessions[id] = &session{id: id, view: v}
	d.log.Info("session opened", "session", id, "mount", mount, "atoms", set.Atoms())
	return v, nil
}

func (d *Daemon) closeSession(id string) error {
	d.mu.Lock()
	s, ok := d.sessions[id]
	delete(d.sessions, id)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	err := s.view.Unmount()
	d.log.Info("session closed", "session", id, "err", err)
	return err
}

func (d *Daemon) session(id string) (*session, *control.Error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[id]
	if !ok {
		return nil, control.Errorf(control.CodeUnknownSession, "unknown session %q: open it with session.open, or list them with session.list", id)
	}
	return s, nil
}

// Reload re-reads both config files now (with force, even if unchanged)
// and invalidates every view after a swap. It returns the config status.
func (d *Daemon) Reload(force bool) map[string]FileStatus {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	condChanged, err := d.conditions.reload(force)
	if err != nil {
		d.log.Error("conditions reload failed; last good config stays", "err", err)
	}
	if _, err := d.policy.reload(force); err != nil {
		d.log.Error("policy reload failed; last good policy stays", "err", err)
	}
	if condChanged {
		d.log.Info("conditions reloaded", "generation", d.conditions.status().Generation)
		d.mu.Lock()
		views := make([]*fsys.View, 0, len(d.sessions))
		for _, s := range d.sessions {
			views = append(views, s.view)
		}
		d.mu.Unlock()
		for _, v := range views {
			if err := v.Invalidate(); err != nil {
				d.log.Warn("invalidate view", "mount", v.Mountpoint(), "err", err)
			}
		}
	}
	return d.configStatus()
}

func (d *Daemon) configStatus() map[string]FileStatus {
	return map[string]FileStatus{"conditions": d.conditions.status(), "policy": d.policy.status()}
}

type sessionInfo struct {
	ID          string   `json:"id"`
	Mount       string   `json:"mount"`
	Atoms       []string `json:"atoms"`
	DaemonReads int64    `json:"daemon_reads"`
}

func (d *Daemon) sessionList() []sessionInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []sessionInfo{}
	for _, s := range d.sessions {
		out = append(out, sessionInfo{ID: s.id, Mount: s.view.Mountpoint(), Atoms: s.view.Context().Atoms(), DaemonReads: s.view.DaemonReads()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func decodeParams(raw json.RawMessage, v any) *control.Error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return control.Errorf(control.CodeInvalidParams, "invalid params: %v", err)
	}
	return nil
}

// handle dispatches one control method.
func (d *Daemon) handle(ctx context.Context, method string, params json.RawMessage) (any, *control.Error) {
	switch method {
	case "session.open":
		var p struct {
			ID      string          `json:"id"`
			Mount   string          `json:"mount"`
			Context json.RawMessage `json:"context"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		set, err := cctx.Parse(p.Context)
		if err != nil {
			return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
		}
		v, cerr := d.OpenSession(p.ID, p.Mount, set)
		if cerr != nil {
			return nil, cerr
		}
		return map[string]any{"id": p.ID, "mount": v.Mountpoint(), "atoms": set.Atoms()}, nil
	case "session.close":
		var p struct {
			ID string `json:"id"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		if _, err := d.session(p.ID); err != nil {
			return nil, err
		}
		if err := d.closeSession(p.ID); err != nil {
			return nil, control.Errorf(control.CodeMount, "unmount: %v", err)
		}
		return struct{}{}, nil
	case "session.list":
		return map[string]any{"sessions": d.sessionList()}, nil
	case "context.set":
		var p struct {
			Session string          `json:"session"`
			Context json.RawMessage `json:"context"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		s, cerr := d.session(p.Session)
		if cerr != nil {
			return nil, cerr
		}
		set, err := cctx.Parse(p.Context)
		if err != nil {
			return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
		}
		if err := s.view.SetContext(set); err != nil {
			return nil, control.Errorf(control.CodeMount, "switch context: %v", err)
		}
		d.log.Info("context set", "session", s.id, "atoms", set.Atoms())
		return map[string]any{"atoms": set.Atoms()}, nil
	case "context.get":
		var p struct {
			Session string `json:"session"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		s, cerr := d.session(p.Session)
		if cerr != nil {
			return nil, cerr
		}
		return map[string]any{"atoms": s.view.Context().Atoms()}, nil
	case "blocks.list":
		var p struct {
			Session string          `json:"session"`
			Context json.RawMessage `json:"context"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		set, cerr := d.contextOf(p.Session, p.Context)
		if cerr != nil {
			return nil, cerr
		}
		blocks, errs := d.conditions.Load().Blocks(d.cfg.BlocksDir, set)
		return map[string]any{"blocks": blocks, "errors": errs}, nil
	case "path.check":
		var p struct {
			Session string          `json:"session"`
			Context json.RawMessage `json:"context"`
			Space   string          `json:"space"`
			Path    *string         `json:"path"`
		}
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		set, cerr := d.contextOf(p.Session, p.Context)
		if cerr != nil {
			return nil, cerr
		}
		sp, err := acl.ParseSpace(p.Space)
		if err != nil {
			return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
		}
		if p.Path == nil {
			return nil, control.Errorf(control.CodeInvalidParams, "path is required")
		}
		canon, err := acl.Canon(*p.Path)
		if err != nil {
			return nil, control.Errorf(control.CodeInvalidParams, "path: %v", err)
		}
		ex := d.conditions.Load().Explain(sp, canon, set)
		if ex.Decision == "deny" {
			d.audit.Info("deny", "kind", "path", "session", p.Session, "atoms", set.Atoms(), "space", sp.String(), "path", canon, "op", "check", "decision", "deny", "why", ex.Why)
		}
		return ex, nil
	case "tool.decide":
		return d.decide(params)
	case "config.reload":
		return d.Reload(true), nil
	case "status":
		return map[string]any{"version": Version, "sessions": d.sessionList(), "config": d.configStatus()}, nil
	}
	return nil, control.Errorf(control.CodeMethodNotFound, "unknown method %q (see spec/control.md: session.open, session.close, session.list, context.set, context.get, blocks.list, path.check, tool.decide, config.reload, status)", method)
}

// contextOf gives the context of a session, or an explicit one.
func (d *Daemon) contextOf(sessionID string, raw json.RawMessage) (cctx.Set, *control.Error) {
	switch {
	case sessionID != "" && len(raw) > 0:
		return cctx.Set{}, control.Errorf(control.CodeInvalidParams, "give session or context, not both")
	case sessionID != "":
		s, err := d.session(sessionID)
		if err != nil {
			return cctx.Set{}, err
		}
		return s.view.Context(), nil
	}
	set, err := cctx.Parse(raw)
	if err != nil {
		return cctx.Set{}, control.Errorf(control.CodeInvalidParams, "%v (or give a session)", err)
	}
	return set, nil
}

func (d *Daemon) decide(params json.RawMessage) (any, *control.Error) {
	req, rest := constraints.DecodeRequest(params)
	sessionID := ""
	for k, v := range rest {
		if k != "session" {
			if req.Invalid == "" {
				req.Invalid = fmt.Sprintf("unknown field %q", k)
			}
			continue
		}
		if v.Kind() != constraints.KindString {
			return nil, control.Errorf(control.CodeInvalidParams, "session must be a string")
		}
		sessionID = v.Str()
	}
	if sessionID != "" {
		if req.Atoms != nil {
			return nil, control.Errorf(control.CodeInvalidParams, "give session or context, not both")
		}
		s, err := d.session(sessionID)
		if err != nil {
			return nil, err
		}
		set := s.view.Context()
		req.Atoms = &set
	}
	dec := d.policy.Load().Decide(&req)
	if dec.Reasons == nil {
		dec.Reasons = []string{}
	}
	var atoms []string
	if req.Atoms != nil {
		atoms = req.Atoms.Atoms()
	}
	d.audit.Info("decide", "kind", "tool", "session", sessionID, "atoms", atoms, "tool", req.Tool, "roles", req.Roles,
		"decision", dec.Decision.String(), "role", dec.Role, "reasons", dec.Reasons)
	return dec, nil
}
