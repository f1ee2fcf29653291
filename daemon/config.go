package daemon

import (
	"github.com/condfs/condfs/internal/configfile"

	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/constraints"
)

// FileStatus is one config file's state, as status reports it.
type FileStatus struct {
	Path       string    `json:"path"`
	Generation int       `json:"generation"`
	LoadedAt   time.Time `json:"loaded_at"`
	Error      *string   `json:"error"`
}

// configFile holds the last good snapshot of one file. Readers load the
// pointer; a reload swaps it whole, so nobody sees half a config.
type configFile[T any] struct {
	path    string
	parse   func(path string, data []byte) (*T, error)
	missing func() *T // what a missing file means at start
	// rejectEmpty: a zero-length file on reload is an error (conditions).
	rejectEmpty bool
	// replacing, if set, is told of the snapshot a reload is about to
	// replace and of the new one, just before it does.
	replacing func(old, cfg *T)

	cur atomic.Pointer[T]

	mu       sync.Mutex
	gen      int
	loadedAt time.Time
	lastErr  *string
	lastSum  [32]byte // content of the last attempt, to load each change once
	lastGone bool
}

// Load returns the current snapshot.
func (c *configFile[T]) Load() *T { return c.cur.Load() }

// initial loads the file at start: a file that fails to load is an error;
// a missing one means c.missing().
func (c *configFile[T]) initial() error {
	data, err := configfile.Read(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		c.cur.Store(c.missing())
		c.lastGone = true
		c.commit()
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", c.path, err)
	}
	v, err := c.parse(c.path, data)
	if err != nil {
		return err
	}
	c.cur.Store(v)
	c.lastSum = sha256.Sum256(data)
	c.commit()
	return nil
}

func (c *configFile[T]) commit() {
	c.gen++
	c.loadedAt = time.Now().UTC()
	c.lastErr = nil
}

// reload re-reads the file. changed reports whether a new snapshot was
// swapped in. With force, an unchanged file is loaded again.
func (c *configFile[T]) reload(force bool) (changed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	data, rerr := configfile.Read(c.path)
	if errors.Is(rerr, fs.ErrNotExist) {
		if c.lastGone && !force {
			return false, nil
		}
		c.lastGone = true
		msg := fmt.Sprintf("%s: the file disappeared; the last good config stays in force", c.path)
		c.lastErr = &msg
		return false, errors.New(msg)
	}
	if rerr != nil {
		msg := fmt.Sprintf("%s: %v; the last good config stays in force", c.path, rerr)
		c.lastErr = &msg
		return false, errors.New(msg)
	}
	if len(data) == 0 && c.rejectEmpty {
		// A truncate not yet followed by its write must never drop every
		// rule: an empty file on reload is treated like a missing one.
		msg := fmt.Sprintf("%s: %v; the last good config stays in force (to remove every rule, leave a comment in the file)", c.path, configfile.ErrEmpty)
		c.lastErr = &msg
		c.lastSum = [32]byte{}
		return false, errors.New(msg)
	}
	sum := sha256.Sum256(data)
	if !force && !c.lastGone && sum == c.lastSum {
		return false, nil
	}
	c.lastGone = false
	c.lastSum = sum
	v, perr := c.parse(c.path, data)
	if perr != nil {
		msg := perr.Error()
		c.lastErr = &msg
		return false, perr
	}
	if c.replacing != nil {
		c.replacing(c.cur.Load(), v)
	}
	c.cur.Store(v)
	c.commit()
	return true, nil
}

// genAndTime is the generation and the time of the last good load.
func (c *configFile[T]) genAndTime() (uint64, time.Time) {
	st := c.status()
	return uint64(st.Generation), st.LoadedAt
}

func (c *configFile[T]) status() FileStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return FileStatus{Path: c.path, Generation: c.gen, LoadedAt: c.loadedAt, Error: c.lastErr}
}

func newConditions(path string) *configFile[acl.Config] {
	return &configFile[acl.Config]{path: path, parse: parseConditions, missing: acl.Empty, rejectEmpty: true}
}

// parseConditions loads conditions.toml and reads what its egress tables
// name (upstream_ca, the secrets' values), as the daemon sees them.
func parseConditions(path string, data []byte) (*acl.Config, error) {
	c, err := acl.Parse(path, data)
	if err != nil {
		return nil, err
	}
	if err := c.ReadValues(); err != nil {
		return nil, err
	}
	return c, nil
}

func newPolicy(path string) *configFile[constraints.Policy] {
	return &configFile[constraints.Policy]{path: path, parse: constraints.Parse, missing: constraints.Empty}
}
