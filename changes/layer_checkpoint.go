package changes

import "errors"

// A staged session's checkpoints are a Store over its layer's upper
// directories (Options.Layer): what the session changes after a checkpoint
// is recorded as the layer held it, and a rollback gives the layer back
// as it was (made while nothing is mounted over it), so the session's
// view shows again what it showed at the checkpoint, and the paths the
// rollback gave back to the backing tree show the backing tree as it is
// now. docs/changes.md.

// Upper is the upper directory of space in the layer ("" for a space it
// does not hold): the root a Store of the session's checkpoints records.
func (l *Layer) Upper(space string) string {
	if sp, ok := l.spaces[space]; ok {
		return sp.upper
	}
	return ""
}

// Rewrite runs edit (a rollback of the session's checkpoints) on the
// layer's upper directories with the view held back and nothing mounted
// over them that edit could race, then mounts every space again: the view
// shows the layer edit left from the moment Rewrite returns.
func (l *Layer) Rewrite(edit func() error) error {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return errors.New("staged: the layer is closed")
	}
	sps := make([]*layerSpace, 0, len(l.names))
	for _, name := range l.names {
		sps = append(sps, l.spaces[name])
	}
	err := l.exclusiveAll(sps, edit)
	l.mu.Lock()
	l.recount()
	l.mu.Unlock()
	return err
}

// Uppers gives every space's upper directory, by space name.
func (l *Layer) Uppers() map[string]string {
	out := map[string]string{}
	for name, sp := range l.spaces {
		out[name] = sp.upper
	}
	return out
}

// LayerRecorder is a staged session's recorder for its view: every change
// goes to the layer first (which refuses one beyond max_bytes), then, once
// a checkpoint exists, to the store of its checkpoints.
type LayerRecorder struct {
	Layer *Layer
	Store *Store
}

// Armed: a layer records every change.
func (r LayerRecorder) Armed() bool { return true }

// Before tells the layer, then the checkpoints' store.
func (r LayerRecorder) Before(space, p string) error {
	if err := r.Layer.Before(space, p); err != nil {
		return err
	}
	return r.Store.Before(space, p)
}

// Moved tells the layer, then the checkpoints' store.
func (r LayerRecorder) Moved(space, from, to string, exchange bool) error {
	if err := r.Layer.Moved(space, from, to, exchange); err != nil {
		return err
	}
	return r.Store.Moved(space, from, to, exchange)
}

// Renamed tells both.
func (r LayerRecorder) Renamed(space, from, to string, exchange bool) {
	r.Store.Renamed(space, from, to, exchange)
	r.Layer.Renamed(space, from, to, exchange)
}

// After tells both.
func (r LayerRecorder) After(space, p string) {
	r.Store.After(space, p)
	r.Layer.After(space, p)
}

// Wrote tells both.
func (r LayerRecorder) Wrote(space, p string, fd int) {
	r.Store.Wrote(space, p, fd)
	r.Layer.Wrote(space, p, fd)
}
