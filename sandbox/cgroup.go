package sandbox

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroups is the set of cgroup directories holding one run: one for cgroup
// v2, or one per v1 controller.
type cgroups struct {
	dirs []string
}

// newCgroups makes the run's cgroups with its limits and puts pid in them:
// a delegated v2 subtree when there is one, else the v1 pids and memory
// controllers. It returns nil, nil when no limit is asked for, and an error
// when no cgroup can be made (the caller falls back to rlimits).
func newCgroups(pid, pids int, memory int64) (*cgroups, error) {
	if pids == 0 && memory == 0 {
		return nil, nil
	}
	name, err := runName()
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return newCgroupV2(name, pid, pids, memory)
	}
	return newCgroupV1(name, pid, pids, memory)
}

func runName() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("cgroup name: %w", err)
	}
	return "run-" + hex.EncodeToString(b[:]), nil
}

func newCgroupV1(name string, pid, pids int, memory int64) (*cgroups, error) {
	cg := &cgroups{}
	type setting struct{ file, value string }
	type controller struct {
		name     string
		settings []setting
	}
	var ctl []controller
	if pids > 0 {
		ctl = append(ctl, controller{"pids", []setting{{"pids.max", strconv.Itoa(pids)}}})
	}
	if memory > 0 {
		m := strconv.FormatInt(memory, 10)
		s := []setting{{"memory.limit_in_bytes", m}}
		// Swap counts too where the kernel accounts it, so the limit is not
		// escaped by swapping.
		if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes")); err == nil {
			s = append(s, setting{"memory.memsw.limit_in_bytes", m})
		}
		ctl = append(ctl, controller{"memory", s})
	}
	for _, c := range ctl {
		base := filepath.Join(cgroupRoot, c.name)
		if err := os.Mkdir(filepath.Join(base, "condfs"), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			cg.remove()
			return nil, fmt.Errorf("cgroup v1 %s: %w", c.name, err)
		}
		dir := filepath.Join(base, "condfs", name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup v1 %s: %w", c.name, err)
		}
		cg.dirs = append(cg.dirs, dir)
		for _, s := range c.settings {
			if err := writeFile(filepath.Join(dir, s.file), s.value); err != nil {
				cg.remove()
				return nil, fmt.Errorf("cgroup v1 %s: %w", c.name, err)
			}
		}
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup v1 %s: join: %w", c.name, err)
		}
	}
	return cg, nil
}

// newCgroupV2 makes the run a child of the daemon's own cgroup when the
// daemon may write there (a delegated subtree) and the controllers can be
// enabled for its children.
func newCgroupV2(name string, pid, pids int, memory int64) (*cgroups, error) {
	own, err := ownCgroupV2()
	if err != nil {
		return nil, err
	}
	parent := filepath.Join(cgroupRoot, own)
	var enable []string
	if pids > 0 {
		enable = append(enable, "+pids")
	}
	if memory > 0 {
		enable = append(enable, "+memory")
	}
	if err := writeFile(filepath.Join(parent, "cgroup.subtree_control"), strings.Join(enable, " ")); err != nil {
		return nil, fmt.Errorf("cgroup v2: enable controllers in %s: %w", parent, err)
	}
	dir := filepath.Join(parent, "condfs-"+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	cg := &cgroups{dirs: []string{dir}}
	if pids > 0 {
		if err := writeFile(filepath.Join(dir, "pids.max"), strconv.Itoa(pids)); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
	}
	if memory > 0 {
		m := strconv.FormatInt(memory, 10)
		for _, f := range []string{"memory.max", "memory.swap.max"} {
			if err := writeFile(filepath.Join(dir, f), m); err != nil && f == "memory.max" {
				cg.remove()
				return nil, fmt.Errorf("cgroup v2: %w", err)
			}
		}
	}
	if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
		cg.remove()
		return nil, fmt.Errorf("cgroup v2: join: %w", err)
	}
	return cg, nil
}

func ownCgroupV2() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("cgroup v2: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("cgroup v2: no unified entry in /proc/self/cgroup")
}

// remove deletes the run's cgroups once their processes are gone. The
// processes of a dead PID namespace may take a moment to leave.
func (cg *cgroups) remove() {
	if cg == nil {
		return
	}
	for _, d := range cg.dirs {
		for i := 0; i < 100; i++ {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cg.dirs = nil
}

func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
