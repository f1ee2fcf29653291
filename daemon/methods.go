package daemon

// The control socket's methods (docs/control.md): each decodes its params,
// finds the session it names for the caller (session), and calls what
// serves it. The checkpoint and changes methods are in changes.go.

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/constraints"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/runs"
	"github.com/condfs/condfs/sandbox"
)

func decodeParams(raw json.RawMessage, v any) *control.Error { return control.DecodeParams(raw, v) }

// methodFunc serves one control method.
type methodFunc func(d *Daemon, ctx context.Context, params json.RawMessage) (any, *control.Error)

// methodTable is the control socket's methods (docs/control.md); each
// m-prefixed method serves the one it is named for.
var methodTable = map[string]methodFunc{
	"session.open":   (*Daemon).mSessionOpen,
	"session.close":  (*Daemon).mSessionClose,
	"session.list":   (*Daemon).mSessionList,
	"context.set":    (*Daemon).mContextSet,
	"context.get":    (*Daemon).mContextGet,
	"blocks.list":    (*Daemon).mBlocksList,
	"path.check":     (*Daemon).mPathCheck,
	"tool.decide":    (*Daemon).decide,
	"run":            (*Daemon).mRun,
	"tools.callable": (*Daemon).mToolsCallable,
	"config.reload":  (*Daemon).mConfigReload,
	"status":         (*Daemon).mStatus,
	// checkpoints and rollback (changes.go)
	"checkpoint.create":   (*Daemon).mCheckpointCreate,
	"checkpoint.list":     (*Daemon).mCheckpointList,
	"checkpoint.rollback": (*Daemon).mCheckpointRollback,
	"changes.diff":        (*Daemon).mChangesDiff,
	"changes.commit":      (*Daemon).mChangesCommit,
	"changes.discard":     (*Daemon).mChangesDiscard,
}

// handle dispatches one control method.
func (d *Daemon) handle(ctx context.Context, method string, params json.RawMessage) (any, *control.Error) {
	if m, ok := methodTable[method]; ok {
		return m(d, ctx, params)
	}
	names := make([]string, 0, len(methodTable))
	for n := range methodTable {
		names = append(names, n)
	}
	slices.Sort(names)
	return nil, control.Errorf(control.CodeMethodNotFound, "unknown method %q (docs/control.md: %s)", method, strings.Join(names, ", "))
}

func (d *Daemon) mSessionOpen(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		ID        string          `json:"id"`
		Mount     string          `json:"mount"`
		Context   json.RawMessage `json:"context"`
		Owner     *uint32         `json:"owner"`
		AllowUIDs []uint32        `json:"allow_uids"`
		Changes   string          `json:"changes"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	mode, cerr := d.changesMode(p.Changes)
	if cerr != nil {
		return nil, cerr
	}
	set, err := cctx.Parse(p.Context)
	if err != nil {
		return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	peer, known := control.PeerUID(ctx)
	if !known {
		peer = uint32(os.Geteuid())
	}
	r := openRequest{peer: peer, id: p.ID, mount: p.Mount, atoms: set, owner: peer, allowUIDs: p.AllowUIDs, changes: mode}
	if p.Owner != nil || len(p.AllowUIDs) > 0 {
		if !privileged(peer) {
			return nil, control.Errorf(control.CodeForbidden, "only root or the daemon's uid may name an owner or let other uids in")
		}
		if p.Owner != nil {
			r.owner = *p.Owner
		}
	}
	v, cerr := d.OpenSession(r)
	if cerr != nil {
		return nil, cerr
	}
	return map[string]any{"id": p.ID, "mount": v.Mountpoint(), "atoms": set.Atoms()}, nil
}

func (d *Daemon) mSessionClose(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		ID string `json:"id"`
		// Discard drops a staged session's uncommitted changes; a
		// direct session has none.
		Discard bool `json:"discard"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := d.session(ctx, p.ID)
	if cerr != nil {
		return nil, cerr
	}
	if cerr := d.mayClose(s, p.Discard); cerr != nil {
		return nil, cerr
	}
	if err := d.closeSession(p.ID); err != nil {
		return nil, control.Errorf(control.CodeMount, "unmount: %v", err)
	}
	return struct{}{}, nil
}

func (d *Daemon) mSessionList(ctx context.Context, _ json.RawMessage) (any, *control.Error) {
	return map[string]any{"sessions": d.sessionList(ctx)}, nil
}

func (d *Daemon) mContextSet(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string          `json:"session"`
		Context json.RawMessage `json:"context"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := d.session(ctx, p.Session)
	if cerr != nil {
		return nil, cerr
	}
	set, err := cctx.Parse(p.Context)
	if err != nil {
		return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	// One switch at a time per session, so that the saved context is
	// the one in force.
	s.switchMu.Lock()
	defer s.switchMu.Unlock()
	start := time.Now()
	d.saveSession(s, set)
	// What the switch takes from the runs goes before the view changes:
	// a view binary allowed as a whole in the old context must not run,
	// bound still, what the new one shows beneath it.
	cfg := d.conditions.Load()
	d.runs.Narrow(s.runs, cfg, s.view.Context(), cfg, set)
	if err := s.view.SetContext(set); err != nil {
		return nil, control.Errorf(control.CodeMount, "switch context: %v", err)
	}
	d.runs.Allow(s.runs, d.conditions.Load(), set)
	d.metrics.ContextSwitch(time.Since(start))
	d.log.Info("context set", "session", s.id, "atoms", set.Atoms())
	return map[string]any{"atoms": set.Atoms()}, nil
}

func (d *Daemon) mContextGet(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string `json:"session"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := d.session(ctx, p.Session)
	if cerr != nil {
		return nil, cerr
	}
	return map[string]any{"atoms": s.view.Context().Atoms()}, nil
}

func (d *Daemon) mBlocksList(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string          `json:"session"`
		Context json.RawMessage `json:"context"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	set, cerr := d.contextOf(ctx, p.Session, p.Context)
	if cerr != nil {
		return nil, cerr
	}
	blocks, errs := d.conditions.Load().Blocks(d.cfg.BlocksDir, set)
	return map[string]any{"blocks": blocks, "errors": errs}, nil
}

func (d *Daemon) mPathCheck(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string          `json:"session"`
		Context json.RawMessage `json:"context"`
		Space   string          `json:"space"`
		Path    *string         `json:"path"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	set, cerr := d.contextOf(ctx, p.Session, p.Context)
	if cerr != nil {
		return nil, cerr
	}
	sp, err := acl.ParseRuleSpace(p.Space)
	if err != nil {
		return nil, control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	if p.Path == nil {
		return nil, control.Errorf(control.CodeInvalidParams, "path is required")
	}
	var ex acl.Explanation
	if cfg := d.conditions.Load(); sp == acl.Exec {
		// What a run in this context may execute: binaries and the exec
		// rules, the name as a run reaches the program by it.
		ex, err = runs.ExplainExec(cfg, *p.Path, set)
	} else {
		ex, err = cfg.ExplainView(sp, *p.Path, set)
	}
	if err != nil {
		return nil, control.Errorf(control.CodeInvalidParams, "path: %v", err)
	}
	if ex.Decision == "deny" {
		key := p.Session
		if key == "" {
			uid, _ := control.PeerUID(ctx)
			key = checker(uid)
		}
		d.auditPathAs(key, p.Session, set, sp, ex.Path, "check")
	}
	return ex, nil
}

func (d *Daemon) mRun(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	return d.runs.Run(ctx, params)
}

func (d *Daemon) mToolsCallable(_ context.Context, params json.RawMessage) (any, *control.Error) {
	// Which of these tools could the roles ever call (a gateway leaves
	// the others out of a listing)? Constraints are not evaluated.
	var p struct {
		Roles []string `json:"roles"`
		Tools []string `json:"tools"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if len(p.Roles) > constraints.MaxRoles || len(p.Tools) > 10000 {
		return nil, control.Errorf(control.CodeInvalidParams, "at most %d roles and 10000 tools", constraints.MaxRoles)
	}
	pol := d.policy.Load()
	callable := []string{}
	for _, t := range p.Tools {
		if pol.MayCall(p.Roles, t) {
			callable = append(callable, t)
		}
	}
	return map[string]any{"callable": callable}, nil
}

// mConfigReload: a forced reload drops every view's kernel caches and
// re-applies every session's runs' binaries, so it is for root and the
// daemon's uid, whose config it is (one admitted uid looping it made
// another's walk of its own tree 245 times slower). Changed files are
// reloaded by the watch without anyone asking.
func (d *Daemon) mConfigReload(ctx context.Context, _ json.RawMessage) (any, *control.Error) {
	if peer, known := control.PeerUID(ctx); known && !privileged(peer) {
		return nil, control.Errorf(control.CodeForbidden, "config.reload is for root and the daemon's uid; the daemon reloads changed config files by itself")
	}
	return d.Reload(true), nil
}

func (d *Daemon) mStatus(ctx context.Context, _ json.RawMessage) (any, *control.Error) {
	restore := d.restoreErrors
	if restore == nil {
		restore = []string{}
	}
	return map[string]any{"version": Version, "sessions": d.sessionList(ctx), "config": d.configStatus(), "panics": d.panics(),
		"restore_errors": restore, "limits": d.limits(), "sandbox": sandbox.Probe(), "runs": d.runs.Status(), "egress": d.runs.EgressStatus()}, nil
}

// contextOf gives the context of a session, or an explicit one.
func (d *Daemon) contextOf(ctx context.Context, sessionID string, raw json.RawMessage) (cctx.Set, *control.Error) {
	switch {
	case sessionID != "" && len(raw) > 0:
		return cctx.Set{}, control.Errorf(control.CodeInvalidParams, "give session or context, not both")
	case sessionID != "":
		s, err := d.session(ctx, sessionID)
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

// testDecideFault, set only by tests, runs at the start of every decision.
var testDecideFault atomic.Pointer[func()]

// Large tool.decide requests (params over largeDecide bytes) are decoded
// and decided at most largeDecides at a time, in the order they came:
// decoding one holds several times its size, and one uid's 120
// connections sending 1 MiB requests at once took the daemon from 15 MB
// to 512 MB. Deciding never blocks, so a token is held for milliseconds;
// small requests never wait for one.
const (
	largeDecide  = 64 << 10
	largeDecides = 4
)

func (d *Daemon) decide(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	if f := testDecideFault.Load(); f != nil {
		(*f)()
	}
	if len(params) > largeDecide {
		select {
		case d.largeDecides <- struct{}{}: // a channel's waiting senders go in order
			defer func() { <-d.largeDecides }()
		case <-ctx.Done():
			return nil, control.Errorf(control.CodeInternal, "the request was given up before its turn")
		}
	}
	// Decoded once, by constraints; the daemon adds only the session's
	// context.
	req := constraints.DecodeRequest(params)
	if req.Session != "" && req.Invalid == "" {
		s, err := d.session(ctx, req.Session)
		if err != nil {
			return nil, err
		}
		set := s.view.Context()
		req.Atoms = &set
	}
	sessionID := req.Session
	pol := d.policy.Load()
	dec := pol.Decide(&req)
	role := "none"
	if dec.Role != nil {
		role = "unknown" // a caller's name that fell back to default
		if pol.HasRole(*dec.Role) {
			role = *dec.Role
		}
	}
	d.metrics.Decision(dec.Decision.String(), role)
	if dec.Reasons == nil {
		dec.Reasons = []string{}
	}
	var atoms []string
	if req.Atoms != nil {
		atoms = req.Atoms.Atoms()
	}
	var decidingRole *string
	if dec.Role != nil {
		r := clip(*dec.Role)
		decidingRole = &r
	}
	attrs := []any{"kind", "tool", "session", sessionID, "atoms", atoms, "tool", clip(req.Tool), "roles", clipAll(req.Roles),
		"decision", dec.Decision.String(), "role", decidingRole, "reasons", clipAll(dec.Reasons)}
	// Collapsed per session (a decision made with a context, not a
	// session: per uid), identical decisions once a window (audit.go).
	key := sessionID
	if key == "" {
		uid, _ := control.PeerUID(ctx)
		key = checker(uid)
	}
	roleName := ""
	if decidingRole != nil {
		roleName = *decidingRole
	}
	// The roles and the atoms each in a key of their own: laid end to end,
	// roles [r, a] with atoms [b] read as roles [r] with atoms [a, b].
	what := keyOf(clip(req.Tool), keyOf(clipAll(req.Roles)...), keyOf(atoms...))
	why := keyOf(append([]string{dec.Decision.String(), roleName}, clipAll(dec.Reasons)...)...)
	d.auditDecision(dec.Decision.String() == "allow", key, denialKey{"tool", what, why}, "decide", attrs)
	return dec, nil
}
