package fsys

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestGroupsKey: a caller's groups survive their use as a map key.
func TestGroupsKey(t *testing.T) {
	for _, g := range [][]uint32{nil, {7}, {1, 2, 65534, 1 << 31}} {
		back := keyGroups(groupsKey(g))
		if len(g) == 0 && len(back) == 0 {
			continue
		}
		if !reflect.DeepEqual(back, g) {
			t.Errorf("%v came back as %v", g, back)
		}
	}
	if groupsKey([]uint32{1, 2}) == groupsKey([]uint32{2, 1}) {
		t.Error("two orders of groups share a key")
	}
}

// TestGroupCache: a caller's groups come from its /proc status, only while
// the process still has the fsuid the request named; an entry serves its
// pid and ids alone, and the table is bounded.
func TestGroupCache(t *testing.T) {
	var g groupCache
	// A child's status, not this process's: /proc/PID/status shows the
	// main thread, which another test may have left acting as a caller.
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	pid, uid, gid := uint32(child.Process.Pid), uint32(os.Getuid()), uint32(os.Getgid())
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.of(pid, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != uint32(want[i]) {
			t.Fatalf("groups %v, want %v", got, want)
		}
	}
	// Served from the entry: a poisoned one shows it is used...
	g.entries[pid] = groupEntry{uid: uid, gid: gid, groups: []uint32{4242}, at: time.Now()}
	if got, _ := g.of(pid, uid, gid); len(got) != 1 || got[0] != 4242 {
		t.Errorf("within the TTL: %v, want the entry's", got)
	}
	// ...but not for other ids, and not once it is old.
	if got, _ := g.of(pid, uid, gid+1); len(got) == 1 && got[0] == 4242 {
		t.Error("an entry served another gid")
	}
	g.entries[pid] = groupEntry{uid: uid, gid: gid, groups: []uint32{4242}, at: time.Now().Add(-2 * groupTTL)}
	if got, _ := g.of(pid, uid, gid); len(got) == 1 && got[0] == 4242 {
		t.Error("an expired entry served")
	}
	if _, err := g.of(pid, uid+1, gid); err == nil || !strings.Contains(err.Error(), "no longer has fsuid") {
		t.Errorf("another uid's request for this pid: %v", err)
	}
	if _, err := g.of(0, uid, gid); err == nil {
		t.Error("a request without a pid was given groups")
	}
	if _, err := g.of(1<<22+12345, uid, gid); err == nil {
		t.Error("a pid that does not exist was given groups")
	}
	delete(g.entries, pid)
	for i := uint32(0); len(g.entries) < groupCacheLimit; i++ {
		g.entries[1<<30+i] = groupEntry{}
	}
	if _, err := g.of(pid, uid, gid); err != nil || len(g.entries) != 1 {
		t.Errorf("a full table: %v, %d entries after one more, want 1", err, len(g.entries))
	}
}

// TestThreadSet: pinned threads are busy while a request runs on them, at
// most maxIdle are idle between requests, and idle entries of threads that
// are gone make room.
func TestThreadSet(t *testing.T) {
	ts := threadSet{maxIdle: 2}
	k := credKey{uid: 1000, gid: 1000, groups: groupsKey([]uint32{5})}
	if ts.keep(1) {
		t.Error("an unknown thread kept its pin")
	}
	if _, ok := ts.key(1); ok {
		t.Error("an unknown thread has credentials")
	}
	ts.record(1, k)
	ts.record(2, k)
	if got, ok := ts.key(1); !ok || got != k {
		t.Errorf("key: %v %v", got, ok)
	}
	if !ts.keep(1) || !ts.keep(2) || ts.idle != 2 {
		t.Fatalf("two idle within the limit: idle %d", ts.idle)
	}
	// A third thread (this one) beyond the limit gives its pin up while
	// dead threads were looked for less than pruneEvery ago (threads 1
	// and 2 do not exist in this process).
	ts.pruned = time.Now()
	self := unix.Gettid()
	ts.record(self, k)
	if ts.keep(self) {
		t.Error("a thread beyond maxIdle kept its pin")
	}
	// Once the dead ones are looked for, their entries go.
	ts.pruned = time.Time{}
	if !ts.keep(self) {
		t.Error("the dead threads' entries did not make room")
	}
	if _, ok := ts.m[1]; ok {
		t.Error("a dead thread's idle entry stayed")
	}
	ts.record(self, k) // busy again
	if ts.idle != 0 {
		t.Errorf("idle %d after the live thread got a request", ts.idle)
	}
	ts.keep(self)
	ts.forget(self)
	ts.forget(self)
	if ts.idle != 0 || len(ts.m) != 0 {
		t.Errorf("after forget: idle %d, %d entries", ts.idle, len(ts.m))
	}
}
