package changes

import (
	"os"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestStagedFileOpenedForWritingConflictsWithAnotherWritersChange:
// overlayfs copies a file into the layer when it is opened for writing
// (editors and databases open read-write and may never write). Until
// another writer changes the backing file the copy is no change (the diff
// lists nothing); after, a commit reports the path a conflict and leaves
// the other writer's change be: never a silent overwrite with the copy.
func TestStagedFileOpenedForWritingConflictsWithAnotherWritersChange(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `: 3<>a.txt`)
	if got, _ := stagedDiff(d, "s"); len(got) != 0 {
		t.Errorf("a file only opened for writing is listed as changed: %v", got)
	}
	os.WriteFile(ws+"/a.txt", []byte("host\n"), 0o644)
	commitLeavesHostsFile(t, d, "/a.txt")
}

// TestStagedWriteThroughAnEarlierOpenConflictsWithAnotherWriter: a file
// opened for writing before another writer changed it in the backing tree,
// then written by the session, is a conflict at commit, never a silent
// overwrite of the other writer's change.
func TestStagedWriteThroughAnEarlierOpenConflictsWithAnotherWriter(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	sh := testenv.StartShell(t)
	ok, id := sh.Do("open", mnt+"/workspace/a.txt")
	if !ok {
		t.Fatalf("open: %s", id)
	}
	os.WriteFile(ws+"/a.txt", []byte("host\n"), 0o644)
	time.Sleep(500 * time.Millisecond) // past the backing watch's remount
	if ok, out := sh.Do("write", id, "S"); !ok {
		t.Fatalf("write: %s", out)
	}
	commitLeavesHostsFile(t, d, "/a.txt")
}

// TestStagedCopyOpenedForWritingKeepsItsBaseAcrossADiscard: a discard
// leaves a file the session opened for writing but never changed (nothing
// lists it; a descriptor may still be open on it), and what it was copied
// from stays noted: a later change by another writer is a conflict at
// commit, never overwritten by the copy.
func TestStagedCopyOpenedForWritingKeepsItsBaseAcrossADiscard(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `: 3<>a.txt`)
	d.Call("changes.discard", map[string]any{"session": "s"}, nil)
	os.WriteFile(ws+"/a.txt", []byte("host\n"), 0o644)
	commitLeavesHostsFile(t, d, "/a.txt")
}

// TestStagedCopyAndTheBackingFileItCameFromAreTwoFiles: after another
// writer moves a backing file the session has changed to another name,
// the view shows both: the session's copy at its name and the backing
// file at its new one, each with its own content, and lists both
// directories (overlayfs took them for one file, by the origin it notes in
// the copy: the second looked up answered ESTALE, and so did a listing of
// its directory).
func TestStagedCopyAndTheBackingFileItCameFromAreTwoFiles(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `printf mine > a.txt`)
	if err := os.Rename(ws+"/a.txt", ws+"/d/moved.txt"); err != nil {
		t.Fatal(err)
	}
	want := "alpha\n\nmine\nlisted"
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := testenv.ShAsNobody(t, mnt+"/workspace", `cat d/moved.txt; echo; cat a.txt; echo; ls . d >/dev/null && echo listed; true`)
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view shows %q; want %q", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// staleUntilCommit turns the backing watch off: the layer is mounted afresh
// only at commits, discards and rollbacks, so a view shows an entry another
// writer replaced as it was for as long as a test needs (with the watch,
// for up to 200 ms and a remount).
const staleUntilCommit = "--staged-watch=false"

// TestStagedWriteToAFileTheViewShowsStaleConflicts: until the layer is
// mounted afresh, the view shows a backing file replaced by
// another writer (a rename over it) as it was; a write there copies the
// old file into the layer. The commit finds the other writer's file a
// conflict, never overwriting it with the old one's content.
func TestStagedWriteToAFileTheViewShowsStaleConflicts(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, staleUntilCommit)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt >/dev/null`)
	os.WriteFile(ws+"/new.tmp", []byte("host\n"), 0o644)
	if err := os.Rename(ws+"/new.tmp", ws+"/a.txt"); err != nil {
		t.Fatal(err)
	}
	testenv.ShAsNobody(t, mnt+"/workspace", `printf S >> a.txt`)
	commitLeavesHostsFile(t, d, "/a.txt")
}

// TestStagedFileMadeWhereTheViewShowsNothingConflicts: until the layer is
// mounted afresh, the view shows no file at a name where
// another writer has just made one; a file the session makes there is a
// conflict at commit, never a silent overwrite of the other writer's.
func TestStagedFileMadeWhereTheViewShowsNothingConflicts(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, staleUntilCommit)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `cat n.txt 2>/dev/null; true`)
	os.WriteFile(ws+"/n.txt", []byte("host\n"), 0o666)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf S > n.txt`)
	commitLeavesHostsFile(t, d, "/n.txt")
}

// TestStagedRemovalOfAFileTheViewShowsStaleConflicts: a file the session
// removes while the view still shows what another writer has just
// replaced by rename is a conflict at commit: the other writer's file
// stays.
func TestStagedRemovalOfAFileTheViewShowsStaleConflicts(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, staleUntilCommit)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `cat a.txt >/dev/null`)
	os.WriteFile(ws+"/new.tmp", []byte("host\n"), 0o644)
	if err := os.Rename(ws+"/new.tmp", ws+"/a.txt"); err != nil {
		t.Fatal(err)
	}
	testenv.ShAsNobody(t, mnt+"/workspace", `rm a.txt`)
	commitLeavesHostsFile(t, d, "/a.txt")
}

// TestStagedDiscardLeavesNoConflictWithAChangeMadeBeforeIt: a discard
// leaves the view as the backing tree is; another writer's change made
// before it (to a file the session had only opened for writing) is no
// conflict for what the session writes after.
func TestStagedDiscardLeavesNoConflictWithAChangeMadeBeforeIt(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil)
	ws := d.Home.Path("workspace")
	testenv.ShAsNobody(t, mnt+"/workspace", `: 3<>a.txt`)
	then := time.Now().Add(-time.Hour)
	if err := os.Chtimes(ws+"/a.txt", then, then); err != nil {
		t.Fatal(err)
	}
	d.Call("changes.discard", map[string]any{"session": "s"}, nil)
	testenv.ShAsNobody(t, mnt+"/workspace", `printf S >> a.txt`)
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if r.Committed != 1 || len(r.Conflicts) != 0 {
		t.Fatalf("commit: %+v; want a.txt committed, no conflict", r)
	}
	if b, _ := os.ReadFile(ws + "/a.txt"); string(b) != "alpha\nS" {
		t.Fatalf("the backing file holds %q", b)
	}
}

// commitLeavesHostsFile commits the session "s" and wants p (in workspace)
// reported as the one conflict, the backing tree still holding the other
// writer's "host\n" there.
func commitLeavesHostsFile(t *testing.T, d *testenv.Daemon, p string) {
	t.Helper()
	var r commitResult
	d.Call("changes.commit", map[string]any{"session": "s"}, &r)
	if b, err := os.ReadFile(d.Home.Path("workspace" + p)); string(b) != "host\n" {
		t.Fatalf("commit %+v left %q at %s (%v), not the other writer's file", r, b, p, err)
	}
	if len(r.Conflicts) != 1 || r.Conflicts[0].Path != p {
		t.Fatalf("commit: %+v; want %s a conflict", r, p)
	}
}
