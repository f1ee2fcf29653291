package daemon

import (
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watch follows the directories that hold the config files, not the files:
// editors replace files by rename, and a Kubernetes ConfigMap swaps a
// "..data" symlink, so a watch on the file itself would go deaf. Events
// are debounced: a change loads once nothing more has happened for the
// debounce time, so a truncate followed by a write is read whole. Prompt
// blocks need no watch: they are read on each request.
func (d *Daemon) watch() (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, f := range []string{d.cfg.Conditions, d.cfg.Policy} {
		dirs[filepath.Dir(f)] = true
	}
	for dir := range dirs {
		if err := w.Add(dir); err != nil {
			d.log.Warn("cannot watch config directory; reload with config.reload", "dir", dir, "err", err)
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var timer *time.Timer
		var fire <-chan time.Time
		for {
			select {
			case <-done:
				if timer != nil {
					timer.Stop()
				}
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				d.log.Debug("config directory event", "event", ev.String())
				if timer == nil {
					timer = time.NewTimer(d.cfg.Debounce)
				} else {
					timer.Stop()
					timer.Reset(d.cfg.Debounce)
				}
				fire = timer.C
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				d.log.Warn("config watcher", "err", err)
			case <-fire:
				fire = nil
				d.Reload(false)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		w.Close()
	}, nil
}
