package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/configfile"
)

// Crash-only: each open session has a small state file,
// STATE_DIR/sessions/ID.json, written whenever the session opens or
// switches context and removed when a client closes it. After a crash
// (kill -9) the next start restores every session on its mountpoint, in its
// last context, before the socket accepts anyone; a session that cannot be
// restored is reported in status and the log. With systemd's
// Restart=always a crash then heals itself, with no action by the agent
// runtime.
//
// The state is written before the request that changed it is answered, so
// a crash never restores an older (possibly more permissive) context than
// the last one answered; a write that fails removes the file instead (the
// session is then lost to a crash, never restored wider). Each write is one
// pwrite of a whole record padded to a multiple of 4 KiB, never shorter
// than the last: a crash cannot tear it (a process dies between system
// calls, not inside one), so there is no temporary file, no rename and no
// fsync on the context switch path; a power cut ends every mount and agent
// anyway. The file is opened for each write and closed after it: a session
// holds no descriptor of its own (on a shared connection, none at all), so
// the descriptor limit bounds open files, not sessions (limits.go).

// savedSession is one session's state.
type savedSession struct {
	ID        string   `json:"id"`
	Mount     string   `json:"mount"`
	Peer      uint32   `json:"peer"` // who opened it: the mountpoint rules are theirs again
	Owner     uint32   `json:"owner"`
	AllowUIDs []uint32 `json:"allow_uids,omitempty"`
	Atoms     []string `json:"atoms"`
	Changes   string   `json:"changes,omitempty"` // staged; direct when empty
}

const stateRecord = 4096

func (d *Daemon) stateDir() string {
	if d.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(d.cfg.StateDir, "sessions")
}

// saveSession writes s's state with the context atoms (the one about to be
// in force: a context switch is saved before it is made, so that a crash in
// between restores the context the client asked for). d.mu is not held.
func (d *Daemon) saveSession(s *session, atoms cctx.Set) {
	dir := d.stateDir()
	if dir == "" {
		return
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	p := filepath.Join(dir, s.id+".json")
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if s.stateSize == 0 {
		// A new session: nothing of a former one by this id stays.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			d.log.Error("session state: a crash now would lose this session", "session", s.id, "dir", dir, "err", err)
			return
		}
		flags |= unix.O_TRUNC
	}
	rec, _ := json.Marshal(savedSession{
		ID: s.id, Mount: s.mount, Peer: s.peer, Owner: s.owner, AllowUIDs: s.allowUIDs, Atoms: atoms.Atoms(), Changes: stagedOnly(s.mode),
	})
	size := max(s.stateSize, (len(rec)+1+stateRecord-1)/stateRecord*stateRecord)
	buf := make([]byte, size)
	copy(buf, rec)
	for i := len(rec); i < size; i++ {
		buf[i] = ' '
	}
	buf[size-1] = '\n'
	// Raw system calls, as os.OpenFile would double the cost (measured on
	// ext4: a save takes about 6 µs this way, 13 µs through os.File, 2 µs
	// as a pwrite on a file kept open).
	fd, err := unix.Open(p, flags, 0o600)
	if err == nil {
		var n int
		if n, err = unix.Pwrite(fd, buf, 0); err == nil && n < len(buf) {
			err = io.ErrShortWrite
		}
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
	}
	if err != nil {
		// Fail closed: an older, possibly wider context must not come back.
		os.Remove(p)
		s.stateSize = 0
		d.log.Error("session state: a crash now would lose this session", "session", s.id, "err", err)
		return
	}
	s.stateSize = size
}

// dropSession forgets s's state: removed when a client closed the
// session, kept when the daemon stops.
func (d *Daemon) dropSession(s *session, remove bool) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if remove && d.stateDir() != "" {
		os.Remove(filepath.Join(d.stateDir(), s.id+".json"))
	}
}

// restoreState reopens the sessions of the state directory. It never stops
// the start: what cannot be restored is reported.
func (d *Daemon) restoreState() {
	dir := d.stateDir()
	if dir == "" {
		return
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		d.restoreErrors = append(d.restoreErrors, fmt.Sprintf("%s: %v; no session restored", dir, err))
		return
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var s savedSession
		data, err := configfile.Read(p)
		if err == nil {
			err = json.Unmarshal(data, &s)
		}
		if err == nil && s.ID+".json" != e.Name() {
			err = fmt.Errorf("names session %q", s.ID)
		}
		if err != nil {
			d.restoreErrors = append(d.restoreErrors, fmt.Sprintf("%s: %v", p, err))
			d.log.Error("restore session", "file", p, "err", err)
			continue
		}
		d.mu.Lock()
		_, open := d.sessions[s.ID]
		d.mu.Unlock()
		if open {
			continue // opened at start already (--mount)
		}
		atoms, err := cctx.NewSet(s.Atoms)
		if err != nil {
			d.restoreErrors = append(d.restoreErrors, fmt.Sprintf("session %s: context %v: %v", s.ID, s.Atoms, err))
			continue
		}
		if _, cerr := d.OpenSession(openRequest{peer: s.Peer, id: s.ID, mount: s.Mount, atoms: atoms, owner: s.Owner, allowUIDs: s.AllowUIDs, restored: true, changes: s.Changes}); cerr != nil {
			d.restoreErrors = append(d.restoreErrors, fmt.Sprintf("session %s on %s: %s", s.ID, s.Mount, cerr.Message))
			d.log.Error("restore session", "session", s.ID, "mount", s.Mount, "err", cerr.Message)
			os.Remove(p) // reported once; a later start does not retry it
			continue
		}
		d.restored++
		d.log.Info("session restored", "session", s.ID, "mount", s.Mount, "atoms", s.Atoms)
	}
}
