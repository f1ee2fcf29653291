package changes

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// A commit writes each file, symlink and FIFO under a temporary name
// beside its target in the backing tree, then renames it over the target.
// A daemon killed between the two would leave the temporary there for
// good: each name is noted in temps.jsonl, in the layer's directory,
// before it is made, and what the journal names is removed when the layer
// opens again and before the next commit. Only names the journal holds
// are removed (random, made by the commit itself), and never a directory.

type tempNote struct {
	S string `json:"s"` // space
	D string `json:"d"` // the directory beneath the backing root
	N string `json:"n"` // the temporary name in it
}

func (l *Layer) tempsPath() string { return filepath.Join(l.opts.Dir, "temps.jsonl") }

// noteTemp notes that a commit is about to make name in dir of space.
func (l *Layer) noteTemp(space, dir, name string) error {
	data, err := json.Marshal(tempNote{S: space, D: dir, N: name})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.tempsPath(), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("staged: note a temporary name: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("staged: note a temporary name: %w", err)
	}
	return nil
}

// clearTemps removes what the journal names that is still there (left by
// a commit a crash interrupted), then empties the journal.
func (l *Layer) clearTemps() error {
	data, err := os.ReadFile(l.tempsPath())
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("staged: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var n tempNote
		if json.Unmarshal(sc.Bytes(), &n) != nil || !isTempName(n.N) {
			continue // a torn last line: its name was not made
		}
		sp, ok := l.spaces[n.S]
		if !ok {
			continue
		}
		pfd, err := safepath.Beneath(sp.lowerFD, n.D, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			continue // its directory went: so did it
		}
		var st unix.Stat_t
		if unix.Fstatat(pfd, n.N, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := unix.Unlinkat(pfd, n.N, 0); err != nil && err != unix.ENOENT {
				unix.Close(pfd)
				return fmt.Errorf("staged: remove %s%s: %w", n.S, joinPath(n.D, n.N), err)
			}
		}
		unix.Close(pfd)
	}
	if err := os.Remove(l.tempsPath()); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("staged: %w", err)
	}
	return nil
}

// isTempName: name is one tempName gives.
func isTempName(name string) bool {
	const prefix = ".condfs-staged-"
	if len(name) != len(prefix)+16 || name[:len(prefix)] != prefix {
		return false
	}
	for _, c := range name[len(prefix):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
