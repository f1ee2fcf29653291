package sandbox

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPrepared: a run built ahead (Prepare) starts its command later
// (Begin) with the stdio, binaries and cwd given then, and nothing of the
// init reaches it.
func TestPrepared(t *testing.T) {
	spec := testSpec(t, "")
	r, err := Prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // kept warm
	in, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	inW.WriteString("from stdin\n")
	inW.Close()
	out, errOut := newOutput(t), newOutput(t)
	err = r.Begin(Command{
		Argv:    []string{"/bin/sh", "-c", "cat; ls /proc/$$/fd; ls -A /tmp; ls /usr/bin; pwd; echo oops >&2; exit 7"},
		Env:     []string{"PATH=/usr/bin:/bin"},
		Cwd:     "/memories",
		Allowed: []string{"/bin/sh", "/usr/bin/ls", "/usr/bin/cat"},
	}, in, out.w, errOut.w)
	in.Close()
	out.w.Close()
	errOut.w.Close()
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	ex := r.Wait()
	<-out.done
	<-errOut.done
	if want := "from stdin\n0\n1\n2\ncat\nls\nsh\n/memories\n"; out.String() != want || ex.Code != 7 || errOut.String() != "oops\n" {
		t.Errorf("got %q, %q, %+v; want %q, exit 7", out.String(), errOut.String(), ex, want)
	}
	if err := r.Begin(Command{Argv: []string{"/bin/sh"}}, nil, nil, nil); err == nil {
		t.Error("a second Begin of one run was accepted")
	}
}

// TestPreparedDropped: a prepared run killed before its command ends, and
// one whose init died cannot begin.
func TestPreparedDropped(t *testing.T) {
	spec := testSpec(t, "")
	r, err := Prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	pid := r.Pid()
	r.Kill()
	r.Wait()
	if err := r.Begin(Command{Argv: []string{"/bin/sh", "-c", "true"}}, nil, nil, nil); err == nil {
		t.Error("Begin of a killed run succeeded")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("the init %d is still there", pid)
	}
	// A command the run may not be given is refused before anything starts.
	r, err = Prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Kill(); r.Wait() }()
	err = r.Begin(Command{Argv: []string{"/bin/sh"}, Allowed: []string{"/usr/bin/nc"}}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "not in binaries") {
		t.Errorf("Begin with an allowed binary not in binaries: %v", err)
	}
}

// TestNothingOutlivesExit: when Wait returns for the command's exit, what
// it left running in the background is gone: it never writes after.
func TestNothingOutlivesExit(t *testing.T) {
	spec := testSpec(t, "(sleep 0.3; echo late > /workspace/late) & exit 0")
	if _, _, ex := run(t, spec); ex.Code != 0 {
		t.Fatalf("exit %+v", ex)
	}
	time.Sleep(600 * time.Millisecond)
	if _, err := os.Stat(spec.Workspace + "/late"); err == nil {
		t.Error("a background process of the run wrote after Wait returned")
	}
}

// TestAgain: a run's sandbox serves another command once the last has
// ended (Again), and nothing of the last is there: not its background
// processes, its /tmp and /dev/shm files or its SysV IPC objects; its
// stdio was let go when its exit was reported. Begin before Again is
// refused.
func TestAgain(t *testing.T) {
	spec := testSpec(t, "")
	spec.Binaries = slices.Concat(testBinaries, []string{"/usr/bin/ipcmk", "/usr/bin/ipcs"})
	spec.Allowed = spec.Binaries
	r, err := Prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Kill(); r.Gone() }()
	begin := func(script string) (string, Exit) {
		t.Helper()
		out := newOutput(t)
		err := r.Begin(Command{Argv: []string{"/bin/sh", "-c", script}, Env: spec.Env, Allowed: spec.Allowed}, nil, out.w, out.w)
		out.w.Close()
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		ex := r.Wait()
		select {
		case <-out.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the command's stdout is still open after its exit")
		}
		return out.String(), ex
	}
	const segments = `n=0; for w in $(ipcs -m); do case $w in 0x*) n=$((n+1));; esac; done; echo $n`
	out, ex := begin("echo x > /tmp/a; echo y > /dev/shm/b; ipcmk -M 4096 >/dev/null; " + segments + "; cat /proc/sys/kernel/hostname; sleep 60 & exit 3")
	if ex.Code != 3 || out != "1\ncondfs\n" {
		t.Fatalf("first command: %q %+v", out, ex)
	}
	if err := r.Begin(Command{Argv: []string{"/bin/true"}}, nil, nil, nil); err == nil {
		t.Fatal("a Begin before Again was accepted")
	}
	for i := range 3 {
		if err := r.Again(); err != nil {
			t.Fatalf("Again %d: %v", i, err)
		}
		out, ex = begin("ls -A /tmp /dev/shm; " + segments + "; cat /proc/[0-9]*/comm; echo z > /tmp/c")
		// Processes: the init and the shell (cat's own is not globbed).
		procs, ok := strings.CutPrefix(out, "/dev/shm:\n\n/tmp:\n0\n")
		if ex.Code != 0 || !ok || strings.Count(procs, "\n") != 2 || !strings.HasSuffix(procs, "\nsh\n") {
			t.Fatalf("command %d after Again: %q %+v", i+2, out, ex)
		}
	}
}

// TestCwdMissing: a cwd that is not a directory of the run is refused as
// such, for a command named by path (checked by the child's chdir) and by
// name (looked up first); nothing runs.
func TestCwdMissing(t *testing.T) {
	spec := testSpec(t, "")
	for _, argv := range [][]string{{"/bin/sh", "-c", "echo ran > /workspace/ran"}, {"sh", "-c", "echo ran > /workspace/ran"}} {
		r, err := Prepare(spec)
		if err != nil {
			t.Fatal(err)
		}
		err = r.Begin(Command{Argv: argv, Env: spec.Env, Cwd: "/workspace/nope", Allowed: spec.Binaries}, nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "cwd") || !strings.Contains(err.Error(), "/workspace/nope is not a directory") {
			t.Errorf("%v in a missing cwd: %v", argv, err)
		}
		r.Kill()
		r.Gone()
		if _, err := os.Stat(spec.Workspace + "/ran"); err == nil {
			t.Errorf("%v ran", argv)
		}
	}
}
