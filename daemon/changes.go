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

// changesMode checks session.open's changes param and gives the mode: ""
// takes [changes] mode of conditions.toml.
func (d *Daemon) changesMode(mode string) (string, *control.Error) {
	if mode == "" {
		mode = d.conditions.Load().Changes().Mode()
	}
	switch mode {
	case "direct":
		return mode, nil
	case "staged":
		if d.cfg.StateDir == "" {
			return "", control.Errorf(control.CodeInvalidParams, "changes \"staged\": a staged session keeps its layer under the state directory, and this daemon has none (--state-dir)")
		}
		return mode, nil
	}
	return "", control.Errorf(control.CodeInvalidParams, "changes %q: want \"direct\" or \"staged\"", mode)
}

// stagedOnly is what a session's saved state says of its mode: "staged"
// or nothing (direct, as every state file before staged sessions).
func stagedOnly(mode string) string {
	if mode == "staged" {
		return mode
	}
	return ""
}

// openLayer opens a staged session's layer before its view is mounted
// (the view serves the merged directories): a restored session finds its
// layer again, a new one starts empty (what an earlier session of the id
// left is removed).
func (d *Daemon) openLayer(s *session, restored bool) *control.Error {
	if s.mode != "staged" {
		return nil
	}
	if d.cfg.StateDir == "" {
		return control.Errorf(control.CodeInvalidParams, "changes \"staged\": the daemon has no state directory (--state-dir)")
	}
	roots := map[string]string{"memories": d.cfg.Memories, "workspace": d.cfg.Workspace}
	cfg := d.conditions.Load().Changes()
	id := s.id
	l, err := changes.OpenLayer(changes.LayerOptions{
		Dir: d.changesDir(s), Roots: roots, Fresh: !restored, MaxBytes: cfg.MaxBytes(), Shared: d.heldBy(s.owner), Owner: s.owner,
		As: ownerOf(s.owner), Watch: d.backingWatch(), Log: d.log,
		OnLimit: func(space, path string) {
			d.metrics.Change("enospc", 1)
			d.audit.Info("changes", "kind", "changes", "session", id, "op", "enospc", "space", space, "path", clip(path),
				"max_bytes", cfg.MaxBytes())
		},
	})
	if errors.Is(err, changes.ErrLayerUnavailable) {
		return control.Errorf(control.CodeInvalidParams, "changes \"staged\": %v", err)
	}
	if err != nil {
		d.log.Error("staged session: its layer cannot be opened", "session", s.id, "err", err)
		return control.Errorf(control.CodeInternal, "session %q: its staged layer cannot be opened: %v", s.id, err)
	}
	s.layer = l
	return nil
}

// backingWatch is the watch every staged layer shares (made now if
// there is none); nil when fanotify cannot be had: the layers are then
// mounted afresh at commits and discards only.
func (d *Daemon) backingWatch() *changes.BackingWatch {
	d.stagedWatchMu.Lock()
	defer d.stagedWatchMu.Unlock()
	if d.cfg.NoStagedWatch {
		return nil
	}
	if os.Geteuid() != 0 {
		// A fanotify mark of a whole filesystem needs CAP_SYS_ADMIN.
		d.stagedWatchOnce.Do(func() {
			d.log.Warn("staged sessions: a daemon that is not root cannot mark the backing filesystems; a staged view is mounted afresh when names change in a backing directory it has looked up (its inotify watches)")
		})
		return nil
	}
	if d.stagedWatch == nil && !d.closing.Load() {
		w, err := changes.NewBackingWatch(0)
		if err != nil {
			d.log.Warn("staged sessions: the backing trees are not watched; a view shows a file another writer replaced as it was until a commit or discard", "err", err)
			return nil
		}
		d.stagedWatch = w
	}
	return d.stagedWatch
}

// closeLayer unmounts a staged session's layer, after its view: removed
// when a client closed the session, kept when the daemon stops (the
// session comes back with it).
func (d *Daemon) closeLayer(s *session, remove bool) {
	if s.layer == nil {
		return
	}
	var err error
	if remove {
		err = s.layer.Remove()
	} else {
		err = s.layer.Close()
	}
	if err != nil {
		d.log.Warn("staged session", "session", s.id, "err", err)
	}
}

// mayClose refuses to close a staged session holding uncommitted changes,
// unless the client discards them.
func (d *Daemon) mayClose(s *session, discard bool) *control.Error {
	if s.layer == nil {
		return nil
	}
	pending, err := s.layer.Pending()
	if err != nil {
		return control.Errorf(control.CodeInternal, "session %q: its staged changes cannot be listed: %v", s.id, err)
	}
	if pending && !discard {
		return control.Errorf(control.CodeUncommitted, "session %q has uncommitted staged changes: commit them (changes.commit), or close with discard (ctl close --discard)", s.id)
	}
	if pending {
		d.metrics.Change("discard", 1)
		d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", s.view.Context().Atoms(), "op", "discard", "reason", "close")
	}
	return nil
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
	dir := d.storeDir(s)
	if _, err := os.Lstat(dir); err != nil {
		return
	}
	if !restored {
		if err := changes.RemoveDir(dir); err != nil {
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

// storeDir is where s's checkpoints are kept: a staged session's beside
// its layer (removed with it).
func (d *Daemon) storeDir(s *session) string {
	if s.layer != nil {
		return filepath.Join(d.changesDir(s), "checkpoints")
	}
	return d.changesDir(s)
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
	if s.layer != nil {
		roots = s.layer.Uppers()
	}
	dir := d.storeDir(s)
	_, statErr := os.Lstat(dir)
	id, atoms := s.id, s.view.Context
	st, err := changes.Open(changes.Options{
		Dir: dir, Fresh: statErr != nil, Roots: roots, Layer: s.layer != nil,
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
	if s.layer != nil {
		s.view.SetChanges(changes.LayerRecorder{Layer: s.layer, Store: st})
	} else {
		s.view.SetChanges(st)
	}
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
	if s.layer != nil {
		s.view.SetChanges(changes.LayerRecorder{Layer: s.layer})
	} else {
		s.view.SetChanges(nil)
	}
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
	var res changes.Result
	var err error
	if s.layer != nil {
		// The layer is rolled back with nothing mounted over it.
		err = s.layer.Rewrite(func() error {
			var rerr error
			res, rerr = st.Rollback(p.Checkpoint, p.Force)
			return rerr
		})
	} else {
		res, err = st.Rollback(p.Checkpoint, p.Force)
	}
	restoredInView(s, res.Touched)
	if err != nil && res.Restored == 0 && len(res.Conflicts) == 0 {
		return nil, changesError(err)
	}
	d.metrics.Change("rollback", 1)
	d.metrics.Change("conflict", len(res.Conflicts))
	d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", s.view.Context().Atoms(), "op", "rollback",
		"checkpoint", p.Checkpoint, "force", p.Force, "restored", res.Restored, "conflicts", conflictNames(res.Conflicts))
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
	if s.layer != nil {
		if p.Since != "" {
			return nil, control.Errorf(control.CodeInvalidParams, "since %q: a staged session's diff is of what it holds back, since it opened (since is for direct sessions; checkpoint.rollback gives its layer back as it was)", p.Since)
		}
		list, hidden, err := s.layer.Diff(p.Content, d.visibleTo(s))
		if err != nil {
			return nil, changesError(err)
		}
		return map[string]any{"changes": list, "hidden": hidden}, nil
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

// conflictNames are the audit's names of conflicts.
func conflictNames(cs []changes.Conflict) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, clip(c.Space+c.Path))
	}
	return out
}

// visibleTo says which paths s's current context may see.
func (d *Daemon) visibleTo(s *session) func(space, path string) bool {
	cfg, atoms := d.conditions.Load(), s.view.Context()
	return func(space, path string) bool {
		sp, err := acl.ParseSpace(space)
		if err != nil {
			return false
		}
		vis, _ := cfg.Visible(sp, path, atoms)
		return vis
	}
}

// stagedOf finds a staged session for a peer; a direct one answers
// -32032.
func (d *Daemon) stagedOf(ctx context.Context, id string) (*session, *control.Error) {
	s, cerr := d.session(ctx, id)
	if cerr != nil {
		return nil, cerr
	}
	if s.layer == nil {
		return nil, control.Errorf(control.CodeNotStaged, "session %q is direct: its changes are in the backing tree already (commit and discard are for staged sessions; use checkpoint.rollback)", id)
	}
	return s, nil
}

func selectorsOf(s *session, paths []string) ([]changes.Selector, *control.Error) {
	sel, err := s.layer.ParseSelectors(paths)
	if err != nil {
		return nil, control.Errorf(control.CodeInvalidParams, "paths: %v", err)
	}
	return sel, nil
}

func stagedError(err error) *control.Error {
	if errors.Is(err, changes.ErrNotStaged) {
		return control.Errorf(control.CodeInvalidParams, "paths: %v (changes.diff lists them)", err)
	}
	return control.Errorf(control.CodeInternal, "%v (what was done stays done; run it again to finish)", err)
}

// mChangesCommit applies a staged session's changes to the backing tree
// (docs/changes.md); a direct session answers -32032.
func (d *Daemon) mChangesCommit(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string   `json:"session"`
		Paths   []string `json:"paths"`
		Force   bool     `json:"force"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := d.stagedOf(ctx, p.Session)
	if cerr != nil {
		return nil, cerr
	}
	sel, cerr := selectorsOf(s, p.Paths)
	if cerr != nil {
		return nil, cerr
	}
	res, err := s.layer.Commit(sel, p.Force)
	restoredInView(s, res.Touched)
	if res.Committed > 0 {
		d.dropCheckpoints(s, "commit")
	}
	if err != nil && res.Committed == 0 && len(res.Conflicts) == 0 {
		return nil, stagedError(err)
	}
	d.metrics.Change("commit", 1)
	d.metrics.Change("conflict", len(res.Conflicts))
	d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", s.view.Context().Atoms(), "op", "commit",
		"paths", clipAll(p.Paths), "force", p.Force, "committed", res.Committed, "conflicts", conflictNames(res.Conflicts))
	if err != nil {
		return nil, stagedError(err)
	}
	return res, nil
}

// mChangesDiscard drops a staged session's changes; a direct session
// answers -32032.
func (d *Daemon) mChangesDiscard(ctx context.Context, params json.RawMessage) (any, *control.Error) {
	var p struct {
		Session string   `json:"session"`
		Paths   []string `json:"paths"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	s, cerr := d.stagedOf(ctx, p.Session)
	if cerr != nil {
		return nil, cerr
	}
	sel, cerr := selectorsOf(s, p.Paths)
	if cerr != nil {
		return nil, cerr
	}
	res, err := s.layer.Discard(sel)
	restoredInView(s, res.Touched)
	if res.Discarded > 0 {
		d.dropCheckpoints(s, "discard")
	}
	if err != nil && res.Discarded == 0 {
		return nil, stagedError(err)
	}
	d.metrics.Change("discard", 1)
	d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", s.view.Context().Atoms(), "op", "discard",
		"paths", clipAll(p.Paths), "discarded", res.Discarded)
	if err != nil {
		return nil, stagedError(err)
	}
	return res, nil
}

// dropCheckpoints drops a staged session's checkpoints after a commit or
// discard changed its layer: none could be rolled back to any more.
func (d *Daemon) dropCheckpoints(s *session, why string) {
	st := s.changes.Load()
	if st == nil {
		return
	}
	dropped, err := st.Drop()
	if err != nil {
		// None may be rolled back to over a layer changed since: the
		// store goes; the next checkpoint.create opens a new one.
		d.log.Error("staged session: its checkpoints could not be dropped; removed", "session", s.id, "err", err)
		s.changesMu.Lock()
		if s.changes.CompareAndSwap(st, nil) {
			s.view.SetChanges(changes.LayerRecorder{Layer: s.layer})
			st.Remove()
		}
		s.changesMu.Unlock()
		return
	}
	atoms := s.view.Context().Atoms()
	for _, c := range dropped {
		d.metrics.Change("dropped", 1)
		d.audit.Info("changes", "kind", "changes", "session", s.id, "atoms", atoms, "op", "dropped", "checkpoint", c.ID,
			"name", c.Name, "changes", c.Changes, "reason", why)
	}
}

// changesUse is what status shows of a session's store.
func changesUse(s *session) *changes.Use {
	if s.layer != nil {
		u := s.layer.Use()
		if st := s.changes.Load(); st != nil {
			cu := st.Use()
			u.Checkpoints, u.Bytes = cu.Checkpoints, u.Bytes+cu.Bytes
		}
		return &u
	}
	st := s.changes.Load()
	if st == nil {
		return nil
	}
	u := st.Use()
	return &u
}
