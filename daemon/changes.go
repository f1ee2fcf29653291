package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/changes"
	"github.com/condfs/condfs/control"
)

// Checkpoints and rollback of direct sessions (docs/changes.md). Each
// session has an undo store, STATE_DIR/changes/ID, given to its view as
// its change recorder: kept across a crash or a stop (the session comes
// back with it), removed when a client closes the session. A daemon
// without a state directory keeps none: checkpoint.create says so.

// changesMode checks session.open's changes param: "" and "direct" open a
// direct session; "staged" is refused until staged sessions exist.
func (d *Daemon) changesMode(mode string) *control.Error {
	if mode == "" {
		mode = d.conditions.Load().Changes().Mode()
	}
	switch mode {
	case "direct":
		return nil
	case "staged":
		return control.Errorf(control.CodeInvalidParams, "changes %q: staged sessions are not available yet (docs/changes.md); open a direct session and use checkpoints", mode)
	}
	return control.Errorf(control.CodeInvalidParams, "changes %q: want \"direct\" or \"staged\"", mode)
}

// openChanges prepares s's undo store when the session opens: a restored
// session whose store exists (it had checkpoints) gets it back at once;
// any other store is opened at its first checkpoint.create (storeOf), so
// that a session that never checkpoints costs no descriptor, directory or
// write (10,000 sessions share one descriptor limit). A fresh session's
// leftover store (an earlier session of that id the daemon did not bring
// back) is removed.
func (d *Daemon) openChanges(s *session, restored bool) {
	if d.cfg.StateDir == "" || s.view == nil {
		return
	}
	dir := d.changesDir(s)
	if _, err := os.Lstat(dir); err != nil {
		return
	}
	if !restored {
		if err := os.RemoveAll(dir); err != nil {
			d.log.Error("session changes: a leftover store could not be removed", "session", s.id, "err", err)
		}
		return
	}
	if _, cerr := d.storeOf(s, true); cerr != nil {
		d.log.Error("session changes: no checkpoints for this session", "session", s.id, "err", cerr.Message)
	}
}

func (d *Daemon) changesDir(s *session) string {
	return filepath.Join(d.cfg.StateDir, "changes", s.id)
}

// storeOf is s's undo store, opened now when open is set and it has none
// (its first checkpoint); nil without open when it has none.
func (d *Daemon) storeOf(s *session, open bool) (*changes.Store, *control.Error) {
	if st := s.changes.Load(); st != nil || !open {
		return st, nil
	}
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	if st := s.changes.Load(); st != nil {
		return st, nil
	}
	if s.changesClosed {
		return nil, control.Errorf(control.CodeUnknownSession, "session %q is closing", s.id)
	}
	if d.cfg.StateDir == "" || s.view == nil {
		return nil, control.Errorf(control.CodeInternal, "session %q keeps no checkpoints: the daemon has no state directory (--state-dir)", s.id)
	}
	cfg := d.conditions.Load().Changes()
	roots := map[string]string{}
	if d.cfg.Memories != "" {
		roots["memories"] = d.cfg.Memories
	}
	if d.cfg.Workspace != "" {
		roots["workspace"] = d.cfg.Workspace
	}
	dir := d.changesDir(s)
	_, statErr := os.Lstat(dir)
	id, atoms := s.id, s.view.Context
	st, err := changes.Open(changes.Options{
		Dir: dir, Fresh: statErr != nil, Roots: roots,
		MaxBytes: cfg.MaxBytes(), MaxCheckpoints: cfg.MaxCheckpoints(), Owner: ownerOf(s.view.Owner()),
		Shared: d.heldBy(s.view.Owner()),
		OnLimit: func(space, path string) {
			d.metrics.Change("enospc", 1)
			d.audit.Info("changes", "kind", "changes", "session", id, "atoms", atoms().Atoms(), "op", "enospc",
				"space", space, "path", clip(path), "max_bytes", cfg.MaxBytes())
		},
	})
	if err != nil {
		d.log.Error("session changes: no checkpoints for this session", "session", s.id, "err", err)
		return nil, control.Errorf(control.CodeInternal, "session %q: its checkpoint store cannot be opened (see the daemon's log)", s.id)
	}
	s.view.SetChanges(st)
	s.changes.Store(st)
	return st, nil
}

// heldBy counts what uid's sessions' checkpoints hold together: max_bytes
// bounds that sum as well as each session's, so that one uid opening many
// sessions cannot fill the state directory, where every user's checkpoints
// live (a change that cannot be recorded is refused: a full state
// directory would refuse everyone's changes).
func (d *Daemon) heldBy(uid uint32) *atomic.Int64 {
	n, _ := d.changesHeld.LoadOrStore(uid, new(atomic.Int64))
	return n.(*atomic.Int64)
}

// ownerOf is whose authority changes.diff reads content with: the
// session owner's uid and primary gid (nogroup's when it has no passwd
// entry).
func ownerOf(uid uint32) *changes.Owner {
	o := &changes.Owner{UID: uid, GID: 65534}
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			o.GID = uint32(g)
		}
	}
	return o
}

// closeChanges ends s's store: removed when a client closed the session,
// kept when the daemon stops. No store is opened for s after it.
func (d *Daemon) closeChanges(s *session, remove bool) {
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	s.changesClosed = true
	st := s.changes.Swap(nil)
	if st == nil {
		return
	}
	s.view.SetChanges(nil)
	var err error
	if remove {
		err = st.Remove()
	} else {
		err = st.Close()
	}
	if err != nil {
		d.log.Warn("session changes", "session", s.id, "err", err)
	}
}

// changesOf finds a session and its store for a peer; the store is opened
// when open is set and s has none yet, else it may be nil (no checkpoint).
func (d *Daemon) changesOf(ctx context.Context, id string, open bool) (*session, *changes.Store, *control.Error) {
	s, cerr := d.session(ctx, id)
	if cerr != nil {
		return nil, nil, cerr
	}
	st, cerr := d.storeOf(s, open)
	if cerr != nil {
		return nil, nil, cerr
	}
	return s, st, nil
}

func changesError(err error) *control.Error {
	switch {
	case errors.Is(err, changes.ErrUnknownCheckpoint):
		return control.Errorf(control.CodeUnknownCheckpoint, "%v (checkpoint.list names them)", err)
	case errors.Is(err, changes.ErrBadName):
		return control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	return control.Errorf(control.CodeInternal, "%v", err)
}

func (d *Daemon) mCheckpointCreate(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string `json:"session"`
		Name    string `json:"name"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.Name != "" && !changes.ValidName(p.Name) {
		return nil, control.Errorf(control.CodeInvalidParams, "name %q: use 1 to 64 of A-Z a-z 0-9 _ . -, not all digits (ids are)", p.Name)
	}
	s, st, cerr := d.changesOf(ctx, p.Session, true)
	if cerr != nil {
		return nil, cerr
	}
	cp, dropped, err := st.Create(p.Name, time.Now())
	if err != nil {
		return nil, changesError(err)
	}
	atoms := s.view.Context().Atoms()
	d.metrics.Change("checkpoint", 1)
	d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", atoms, "op", "checkpoint", "checkpoint", cp.ID, "name", cp.Name)
	if dropped != nil {
		d.metrics.Change("dropped", 1)
		d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", atoms, "op", "dropped", "checkpoint", dropped.ID,
			"name", dropped.Name, "changes", dropped.Changes, "reason", "max_checkpoints")
	}
	return map[string]any{"id": cp.ID, "name": cp.Name, "created": cp.Created.Format(time.RFC3339)}, nil
}

func (d *Daemon) mCheckpointList(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string `json:"session"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	_, st, cerr := d.changesOf(ctx, p.Session, false)
	if cerr != nil {
		return nil, cerr
	}
	type item struct {
		ID      string `json:"id"`
		Name    string `json:"name"`
		Created string `json:"created"`
		Changes int    `json:"changes"`
	}
	out := []item{}
	if st == nil {
		return map[string]any{"checkpoints": out}, nil
	}
	for _, c := range st.List() {
		out = append(out, item{c.ID, c.Name, c.Created.Format(time.RFC3339), c.Changes})
	}
	return map[string]any{"checkpoints": out}, nil
}

func (d *Daemon) mCheckpointRollback(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session    string `json:"session"`
		Checkpoint string `json:"checkpoint"`
		Force      bool   `json:"force"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.Checkpoint == "" {
		return nil, control.Errorf(control.CodeInvalidParams, "checkpoint is required (an id or a name from checkpoint.list)")
	}
	s, st, cerr := d.changesOf(ctx, p.Session, false)
	if cerr != nil {
		return nil, cerr
	}
	if st == nil {
		return nil, changesError(fmt.Errorf("checkpoint %q: %w", p.Checkpoint, changes.ErrUnknownCheckpoint))
	}
	res, err := st.Rollback(p.Checkpoint, p.Force)
	restoredInView(s, res.Touched)
	if err != nil && res.Restored == 0 && len(res.Conflicts) == 0 {
		return nil, changesError(err)
	}
	d.metrics.Change("rollback", 1)
	d.metrics.Change("conflict", len(res.Conflicts))
	conflicts := make([]string, 0, len(res.Conflicts))
	for _, c := range res.Conflicts {
		conflicts = append(conflicts, clip(c.Space+c.Path))
	}
	d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", s.view.Context().Atoms(), "op", "rollback",
		"checkpoint", p.Checkpoint, "force", p.Force, "restored", res.Restored, "conflicts", clipAll(conflicts))
	if err != nil {
		// The tree is restored; what failed is dropping the later logs:
		// running the rollback again finishes it.
		return nil, control.Errorf(control.CodeInternal, "rollback restored %d paths but could not finish (run it again): %v", res.Restored, err)
	}
	return res, nil
}

// restoredInView drops what s's view caches of the paths a rollback
// touched, before the rollback answers: the view shows the restored state
// from then on (as a switch is in force when context.set answers), not
// once its backing watch reports the changes.
func restoredInView(s *session, touched []changes.Touched) {
	if len(touched) == 0 {
		return
	}
	type lists struct{ paths, moved []string }
	by := map[string]*lists{}
	for _, t := range touched {
		l := by[t.Space]
		if l == nil {
			l = &lists{}
			by[t.Space] = l
		}
		if t.Moved {
			l.moved = append(l.moved, t.Path)
		} else {
			l.paths = append(l.paths, t.Path)
		}
	}
	for sp, l := range by {
		s.view.Restored(sp, l.paths, l.moved)
	}
}

func (d *Daemon) mChangesDiff(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string `json:"session"`
		Since   string `json:"since"`
		Content bool   `json:"content"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, st, cerr := d.changesOf(ctx, p.Session, false)
	if cerr != nil {
		return nil, cerr
	}
	if st == nil {
		if p.Since != "" {
			return nil, changesError(fmt.Errorf("checkpoint %q: %w", p.Since, changes.ErrUnknownCheckpoint))
		}
		return map[string]any{"changes": []any{}, "hidden": 0}, nil
	}
	cfg, atoms := d.conditions.Load(), s.view.Context()
	visible := func(space, path string) bool {
		sp, err := acl.ParseSpace(space)
		if err != nil {
			return false
		}
		vis, _ := cfg.Visible(sp, path, atoms)
		return vis
	}
	list, hidden, err := st.Diff(p.Since, p.Content, visible)
	if err != nil {
		return nil, changesError(err)
	}
	return map[string]any{"changes": list, "hidden": hidden}, nil
}

// mChangesCommit and mChangesDiscard answer -32032: only staged sessions
// hold changes back, and none is staged yet.
func (d *Daemon) mChangesCommit(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string   `json:"session"`
		Paths   []string `json:"paths"`
		Force   bool     `json:"force"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	return nil, d.notStaged(ctx, p.Session)
}

func (d *Daemon) mChangesDiscard(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string   `json:"session"`
		Paths   []string `json:"paths"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	return nil, d.notStaged(ctx, p.Session)
}

func (d *Daemon) notStaged(ctx context.Context, id string) *control.Error {
	if _, cerr := d.session(ctx, id); cerr != nil {
		return cerr
	}
	return control.Errorf(control.CodeNotStaged, "session %q is direct: its changes are in the backing tree already (commit and discard are for staged sessions; use checkpoint.rollback)", id)
}

// changesUse is what status shows of a session's store.
func changesUse(s *session) *changes.Use {
	st := s.changes.Load()
	if st == nil {
		return nil
	}
	u := st.Use()
	return &u
}
