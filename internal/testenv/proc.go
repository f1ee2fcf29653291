package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CopySelf copies the test binary where uid 65534 can run it.
func CopySelf(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "self.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// Gone reports whether every thread of pid has exited: a killed process's
// leader is a zombie at once, while threads in D state hold the rest.
func Gone(pid int) bool {
	return strings.Trim(TaskStates(pid), "Z") == ""
}

// TaskStates lists the states of pid's threads ("D" for each thread in an
// uninterruptible wait).
func TaskStates(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	var states []string
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
			states = append(states, s[i+2:i+3])
		}
	}
	return strings.Join(states, "")
}

// ThreadsOf is /proc/PID/status Threads, or -1 once the process is gone.
func ThreadsOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

// PidsCgroup makes a cgroup v1 pids group allowing max tasks, removed at
// cleanup (registered before the daemon's, so it runs after the daemon
// has stopped); join moves a process into it.
func PidsCgroup(t *testing.T, max int) (join func(pid int)) {
	t.Helper()
	dir := fmt.Sprintf("/sys/fs/cgroup/pids/condfs-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("a pids cgroup (v1) is needed: %v", err)
	}
	t.Cleanup(func() {
		// Tasks leave a group when they exit; give the kernel a moment.
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	if err := os.WriteFile(dir+"/pids.max", []byte(strconv.Itoa(max)), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(pid int) {
		if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ProcKB reads a field in kB (VmRSS, VmHWM) of /proc/PID/status.
func ProcKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// FDs is how many descriptors pid holds.
func FDs(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}
