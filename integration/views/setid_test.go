package views

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestWritingSetIDFileClearsItsBitsAsNatively: uids 65534 and 65533 change
// setuid, setgid (with and without group execute) and setuid+setgid files
// owned by root, by the other uid and by themselves, every way a program
// does, through a view and on the backing tree directly, one after the
// other in the same test: each answers the same and leaves the same mode
// and size; and a chmod that sets both bits, which only the owner may. On the shared connection, on a connection per session, and
// with a daemon run by uid 65534 (whose view serves it alone).
func TestWritingSetIDFileClearsItsBitsAsNatively(t *testing.T) {
	for _, kind := range []string{"shared", "per-session"} {
		t.Run(kind, func(t *testing.T) {
			h := testenv.OpenHome(t, testenv.PrivateRule)
			d := testenv.Start(t, h, "--connections="+kind)
			mnt := h.Path("mnt/s")
			d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody, "allow_uids": []int{testenv.Nobody - 1}}, nil)
			setIDChangesMatchNative(t, h, mnt, testenv.Nobody, testenv.Nobody-1)
		})
	}
	t.Run("unprivileged daemon", func(t *testing.T) {
		testenv.RequireUnprivilegedFUSE(t)
		h := testenv.OpenHome(t, testenv.PrivateRule)
		os.MkdirAll(h.Path("run"), 0o755)
		testenv.ChownTree(t, h.Root, testenv.Nobody)
		d := testenv.StartUnder(t, h, testenv.AsUID(testenv.Nobody))
		mnt := h.Path("mnt/s")
		d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody}, nil)
		setIDChangesMatchNative(t, h, mnt, testenv.Nobody)
	})
}

// setIDChangesMatchNative makes every change of every file of
// TestWritingSetIDFileClearsItsBitsAsNatively as each writer, on h's
// backing tree and then through the view at mnt, and compares.
func setIDChangesMatchNative(t *testing.T, h *testenv.Home, mnt string, writers ...int) {
	if err := os.Chmod(h.Path("workspace"), 0o777); err != nil {
		t.Fatal(err)
	}
	shells := map[int]*testenv.Shell{}
	for _, w := range writers {
		shells[w] = testenv.StartShellAs(t, w)
	}
	modes := []uint32{0o4777, 0o2777, 0o2767, 0o6777, 0o4755, 0o6755}
	ways := []string{"write", "pwrite", "ftruncate", "truncate", "otrunc", "creat", "fallocate", "copyrange", "splice", "chmod"}
	n, differ := 0, 0
	for _, owner := range []int{0, testenv.Nobody, testenv.Nobody - 1} {
		for _, mode := range modes {
			for _, way := range ways {
				for _, writer := range writers {
					var got [2]string
					for i, where := range []string{h.Root, mnt} {
						n++
						name := fmt.Sprintf("workspace/f%d", n)
						p := h.Write(name, "0123456789")
						if err := os.Chown(p, owner, owner); err != nil {
							t.Fatal(err)
						}
						if err := os.Chmod(p, os.FileMode(mode&0o777)|unixModeBits(mode)); err != nil {
							t.Fatal(err)
						}
						_, res := shells[writer].Do("modify", where+"/"+name, way)
						st, err := os.Stat(p)
						if err != nil {
							t.Fatal(err)
						}
						got[i] = fmt.Sprintf("%s, then %o size %d", strings.TrimPrefix(res, "ok "), modeBits(st), st.Size())
					}
					if got[0] != got[1] {
						if differ++; differ <= 8 {
							t.Errorf("%s by uid %d of a file of uid %d, mode %o: natively %s; through the view %s", way, writer, owner, mode, got[0], got[1])
						}
					}
				}
			}
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d changes differ from the native ones", differ, n/2)
	}
}

// unixModeBits turns the setuid, setgid and sticky bits of mode into
// os.FileMode's.
func unixModeBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

// modeBits is a file's permission bits with setuid, setgid and sticky, as
// chmod(2) takes them.
func modeBits(st os.FileInfo) uint32 {
	m := uint32(st.Mode().Perm())
	if st.Mode()&os.ModeSetuid != 0 {
		m |= 0o4000
	}
	if st.Mode()&os.ModeSetgid != 0 {
		m |= 0o2000
	}
	if st.Mode()&os.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// TestSetIDSetBeforeAWriteLandsIsCleared: a write (pwrite, fallocate,
// copy_file_range, splice) by uid
// 65534 through a view, to a file it may write (mode 777, of root or of
// another uid), that lands after the file's owner made it setuid and
// setgid leaves neither bit, as natively, whatever the file's mode was when
// the write reached the daemon: a write the daemon made on its own
// authority (root keeps the bits) would leave a setuid file with the
// writer's content. The daemon's test build holds each write between
// choosing how it acts and acting (CONDFS_TEST_CHANGE_DELAY); the owner's
// chmod falls in that window.
func TestSetIDSetBeforeAWriteLandsIsCleared(t *testing.T) {
	t.Setenv("CONDFS_TEST_CHANGE_DELAY", "400ms")
	for _, kind := range []string{"shared", "per-session"} {
		t.Run(kind, func(t *testing.T) {
			h := testenv.OpenHome(t, testenv.PrivateRule)
			d := testenv.Start(t, h, "--connections="+kind)
			mnt := h.Path("mnt/s")
			d.Call("session.open", map[string]any{"id": "s", "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody}, nil)
			if err := os.Chmod(h.Path("workspace"), 0o777); err != nil {
				t.Fatal(err)
			}
			sh := testenv.StartShellAs(t, testenv.Nobody)
			for _, owner := range []int{0, testenv.Nobody - 1} {
				for _, way := range []string{"write", "pwrite", "fallocate", "copyrange", "splice"} {
					name := fmt.Sprintf("workspace/race-%d-%s", owner, way)
					p := h.Write(name, "0123456789")
					if err := os.Chown(p, owner, owner); err != nil {
						t.Fatal(err)
					}
					if err := os.Chmod(p, 0o777); err != nil {
						t.Fatal(err)
					}
					before, _ := os.Stat(p)
					done := make(chan string, 1)
					go func() {
						ok, res := sh.Do("modify", mnt+"/"+name, way)
						if !ok {
							res = "failed: " + res
						}
						done <- res
					}()
					time.Sleep(150 * time.Millisecond)
					if err := os.Chmod(p, 0o777|os.ModeSetuid|os.ModeSetgid); err != nil {
						t.Fatal(err)
					}
					if st, _ := os.Stat(p); st.Size() != before.Size() || !st.ModTime().Equal(before.ModTime()) {
						t.Fatalf("%s landed before the chmod: the window was missed", way)
					}
					res := <-done
					if strings.HasPrefix(res, "failed: ") {
						t.Errorf("%s by uid %d of a file of uid %d: %s", way, testenv.Nobody, owner, res)
					}
					st, err := os.Stat(p)
					if err != nil {
						t.Fatal(err)
					}
					if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
						t.Errorf("%s by uid %d of a file of uid %d made setuid and setgid while the write waited (%s): mode %o after it", way, testenv.Nobody, owner, res, modeBits(st))
					}
				}
			}
		})
	}
}
