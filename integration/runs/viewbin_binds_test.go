package runs

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// allBinRules: /workspace/bin/ listed, no exec rule on it: allowed in
// every context, so a run may always execute it and (the docs) never
// write it.
const allBinRules = testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/tr", "/workspace/bin/", "/workspace/tool.sh"]
`

// TestViewBinaryCwdBeforeBindRunsNothing (A1): a shell whose working directory is
// /workspace/bin while the context does not allow it (no bind: the view's
// own, writable mount) keeps that directory once a switch binds
// /workspace/bin read-only and executable over it: it writes through its
// cwd into the very directory the bind shows, and runs what it wrote
// (a copy of git, which binaries does not list) by the bind.
func TestViewBinaryCwdBeforeBindRunsNothing(t *testing.T) {
	d := binHome(t, viewBinRules)
	d.SetContext("s", testenv.Guild)
	_, stdin, lines := binShell(t, d, `cd /workspace/bin && echo in-bin; read x
{ echo x > /workspace/bin/direct; } 2>&1 | tr -d '\n'; echo " <- by the bind"
tr a a < /usr/lib/git-core/git > ./true && echo wrote-through-cwd
/workspace/bin/true --version; echo "status $?"`)
	if out, ok := waitLine(t, lines, "in-bin", 20*time.Second); !ok {
		t.Fatalf("start: %q", out)
	}
	d.SetContext("s", testenv.DM) // /workspace/bin/ allowed: bound RO+exec
	io.WriteString(stdin, "go\n")
	out, _ := waitLine(t, lines, "status", 20*time.Second)
	t.Logf("output:\n%s", out)
	if strings.Contains(out, "wrote-through-cwd") && strings.Contains(out, "git version") {
		t.Errorf("BROKE: the run wrote into the bound (executable) /workspace/bin and executed a copy of git (not listed)")
	}
}

// TestViewBinaryRebindLeavesNoWritableWindow (B1): /workspace/bin/ is allowed in every
// context, so a run always finds it bound read-only. But every Allow
// (each context.set, even to the same context, each reload) detaches the
// bind and binds it again: in between, /workspace/bin is the view's own
// writable directory. A shell that cds there in a loop lands in it, keeps
// it as its cwd, and writes into what it may execute: it replaces
// /workspace/bin/true by git (not listed) and runs it, and the change
// stays in the workspace for every later run.
func TestViewBinaryRebindLeavesNoWritableWindow(t *testing.T) {
	d := binHome(t, allBinRules)
	_, stdin, lines := binShell(t, d, `echo started
i=0
while :; do
  cd /workspace/bin 2>/dev/null
  if { printf "" > .probe; } 2>/dev/null; then echo "caught after $i"; break; fi
  i=$((i+1))
done
read x
tr a a < /usr/lib/git-core/git > ./true && echo wrote-through-cwd
/workspace/bin/true --version; echo "status $?"`)
	if out, ok := waitLine(t, lines, "started", 20*time.Second); !ok {
		t.Fatalf("start: %q", out)
	}
	caught := false
	var out string
	start := time.Now()
	for i := 0; i < 300 && !caught; i++ {
		d.SetContext("s", testenv.DM) // the same context: nothing changes, but the binds are made again
		if i%50 == 0 {
			t.Logf("%d context.set in %v", i, time.Since(start))
		}
	drain:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the run ended after %d context.set: %q\n%s", i+1, out, testenv.Tail(d.Log(), 30))
				}
				out += l + "\n"
				if strings.Contains(l, "caught") {
					caught = true
					t.Logf("after %d context.set: %s", i+1, l)
				}
			default:
				break drain
			}
		}
	}
	if !caught {
		t.Logf("held: not caught: %q", out)
		return
	}
	d.SetContext("s", testenv.DM)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "status", 20*time.Second)
	t.Logf("output:\n%s", o)
	if strings.Contains(o, "git version") {
		t.Errorf("BROKE: the run wrote into /workspace/bin (always allowed, always bound read-only) and executed a copy of git (not listed)")
	}
	// It persists: a new run executes the replaced file.
	if o2, code := testenv.CondfsRun(t, d, "", "--", "/workspace/bin/true", "--version"); strings.Contains(o2, "git version") {
		t.Errorf("BROKE (persistent): a later run's /workspace/bin/true is git: %q %d", o2, code)
	}
}

// TestViewBinaryParentRenameKeepsBindReadOnly (B2): /workspace/tools/bin/ is listed and
// allowed in every context, so every run finds it bound read-only. Its
// parent is no mount point: a run renames it away (the bind goes with it),
// makes a new tools/bin of its own and writes a program there (a copy of
// git, not listed, no x bit needed: the ELF interpreter maps it). The
// next Allow, or simply the session's next command, binds what the view
// shows there now: the run's own file, executable.
func TestViewBinaryParentRenameKeepsBindReadOnly(t *testing.T) {
	d := binHome(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/bin/sh", "/usr/bin/tr", "/usr/bin/mv", "/usr/bin/mkdir", "/workspace/tools/bin/"]
`)
	d.Home.Write("workspace/tools/bin/hello.sh", "#!/bin/sh\necho hello\n")
	os.Chmod(d.Home.Path("workspace/tools/bin/hello.sh"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	const ld = "/lib64/ld-linux-x86-64.so.2"
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", `
{ echo x > /workspace/tools/bin/g; } 2>&1
mv /workspace/tools /workspace/old && mkdir -p /workspace/tools/bin &&
tr a a < /usr/lib/git-core/git > /workspace/tools/bin/g && echo planted
`+ld+` /workspace/tools/bin/g --version; echo "same run: $?"`)
	t.Logf("run 1 (%d):\n%s", code, out)
	out2, code2 := testenv.CondfsRun(t, d, "", "--", "sh", "-c", ld+" /workspace/tools/bin/g --version")
	t.Logf("run 2 (%d):\n%s", code2, out2)
	if strings.Contains(out2, "git version") {
		t.Errorf("BROKE: a program one run wrote into the listed /workspace/tools/bin/ runs in the next")
	}
	// Within one run: the next context.set (here to the same context) binds
	// the run's own directory.
	_, stdin, lines := binShell(t, d, `mv /workspace/tools /workspace/old2 && mkdir -p /workspace/tools/bin &&
tr a a < /usr/lib/git-core/git > /workspace/tools/bin/g2 && echo it-is; echo planted
read x; `+ld+` /workspace/tools/bin/g2 --version; echo "after set: $?"`)
	if o, ok := waitLine(t, lines, "planted", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	d.SetContext("s", testenv.DM)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "after set", 20*time.Second)
	t.Logf("same run, after a context.set:\n%s", o)
	if strings.Contains(o, "git version") {
		t.Errorf("BROKE: within one run, after a context.set")
	}
}

// TestViewBinaryMountOptions: what the run sees of its mounts (propagation,
// options of the view and of the binds).
func TestViewBinaryMountOptions(t *testing.T) {
	d := binHome(t, viewBinRules)
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", `while read l; do echo "$l"; done < /proc/self/mountinfo`)
	t.Logf("(%d)\n%s", code, out)
}

// TestViewBinaryKernelDetachedBindNeverExecutes (C1): the kernel itself takes a bind away
// (the view's dentry for /workspace/bin invalidated: another actor
// renamed the backing directory and made a new one), so the bind is never
// made noexec (detachView gets EINVAL, "gone"): a shell standing in it
// tries to execute from its cwd after a switch disallows /workspace/bin/.
func TestViewBinaryKernelDetachedBindNeverExecutes(t *testing.T) {
	d := binHome(t, viewBinRules)
	_, stdin, lines := binShell(t, d, `cd /workspace/bin && ./hello.sh && echo ready
read x; ls_out=$(echo *); echo "cwd holds: $ls_out"; ./hello.sh; echo "before switch: $?"; echo checked
read x; ./hello.sh; echo "after switch sh: $?"; ./true; echo "after switch elf: $?"; /lib64/ld-linux-x86-64.so.2 ./true; echo "after switch ld: $?"`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	h := d.Home
	if err := os.Rename(h.Path("workspace/bin"), h.Path("workspace/bin-old")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(h.Path("workspace/bin"), 0o755)
	testenv.ChownTree(t, h.Path("workspace"), testenv.Nobody)
	// Let the view see it (its watches), and the run look it up again.
	time.Sleep(500 * time.Millisecond)
	testenv.CondfsRun(t, d, "", "--", "sh", "-c", "cd /workspace/bin; echo *")
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "checked", 20*time.Second)
	t.Logf("%s", o)
	d.SetContext("s", testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ = waitLine(t, lines, "after switch ld", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, "hello-from-view") || strings.Contains(o, "elf: 0") || strings.Contains(o, "ld: 0") {
		t.Errorf("BROKE: executed from a kernel-detached bind after the switch")
	}
}

// TestViewBinaryHeldDescriptorStopsAtSwitch (C2): descriptors opened through the bind while
// allowed (the file, its directory), used after a switch disallows it:
// execve of /proc/self/fd/N, the ELF interpreter on it, a path relative
// to the directory's descriptor.
func TestViewBinaryHeldDescriptorStopsAtSwitch(t *testing.T) {
	d := binHome(t, viewBinRules)
	_, stdin, lines := binShell(t, d, `exec 3< /workspace/bin/true 4< /workspace/bin; /proc/self/fd/3; echo "allowed: $?"
read x; /proc/self/fd/3; echo "fd exec: $?"; /lib64/ld-linux-x86-64.so.2 /proc/self/fd/3; echo "fd ld: $?"
/proc/self/fd/4/true; echo "dirfd exec: $?"; /proc/self/fd/4/hello.sh; echo "dirfd sh: $?"; echo end`)
	if o, ok := waitLine(t, lines, "allowed", 20*time.Second); !ok || !strings.Contains(o, "allowed: 0") {
		t.Fatalf("%q", o)
	}
	d.SetContext("s", testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, ": 0") || strings.Contains(o, "hello-from-view") {
		t.Errorf("BROKE: executed through a descriptor held across the switch")
	}
}

// TestViewBinaryDirAndFileAreOneSlot (D1): binaries lists the view
// directory /workspace/bin/ and the name /workspace/bin (no slash). Both
// are one slot (one place), which is a directory slot (the first entry's
// kind), allowed when ANY of its names is: the file name /workspace/bin
// is decided alone (no rule names it), so the whole directory is bound
// in a context where dirAllowed refuses it (a rule beneath it,
// evil.sh, holds in DMs only). For host paths resolveBinaries drops the
// name whose kind does not match; for view paths it cannot, and nothing
// else does.
func TestViewBinaryDirAndFileAreOneSlot(t *testing.T) {
	d := binHome(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/bin/sh", "/workspace/bin/", "/workspace/bin"]

[exec."/workspace/bin/evil.sh"]
when = "discord:dm"
action = "allow"
`)
	d.Home.Write("workspace/bin/evil.sh", "#!/bin/sh\necho evil-ran\n")
	os.Chmod(d.Home.Path("workspace/bin/evil.sh"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	var res map[string]any
	d.Call("path.check", map[string]any{"space": "exec", "path": "/workspace/bin/evil.sh", "context": testenv.Guild}, &res)
	t.Logf("path.check exec /workspace/bin/evil.sh in a guild: %v", res)
	d.SetContext("s", testenv.Guild)
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "/workspace/bin/evil.sh; /workspace/bin/hello.sh")
	t.Logf("guild (%d): %q", code, out)
	if strings.Contains(out, "evil-ran") {
		t.Errorf("BROKE: /workspace/bin/evil.sh (exec rule: DMs only) ran in a guild")
	}
}

// TestViewBinaryFileAndDirAreOneSlot (D1b): the other order. The file
// /workspace/tool is listed, its exact exec rule allows it in DMs only;
// /workspace/tool/ is listed too. The slot is a file slot; its directory
// name is allowed in a guild (dirAllowed: no rule on /workspace/tool/\x00,
// no key beneath), so the file is bound executable in a guild.
func TestViewBinaryFileAndDirAreOneSlot(t *testing.T) {
	d := binHome(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/bin/sh", "/workspace/tool", "/workspace/tool/"]

[exec."/workspace/tool"]
when = "discord:dm"
action = "allow"
`)
	d.Home.Write("workspace/tool", "#!/bin/sh\necho tool-ran\n")
	os.Chmod(d.Home.Path("workspace/tool"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	var res map[string]any
	d.Call("path.check", map[string]any{"space": "exec", "path": "/workspace/tool", "context": testenv.Guild}, &res)
	t.Logf("path.check exec /workspace/tool in a guild: %v", res)
	d.SetContext("s", testenv.Guild)
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "/workspace/tool")
	t.Logf("guild (%d): %q", code, out)
	if strings.Contains(out, "tool-ran") {
		t.Errorf("BROKE: /workspace/tool (exec rule: DMs only) ran in a guild")
	}
	out, code = testenv.CondfsRun(t, d, "", "--", "/workspace/tool")
	t.Logf("guild, as the command (%d): %q", code, out)
}

// TestViewBinaryCwdAcrossReload (C3): hypothesis: a reload drops every cached
// entry of the view, so the kernel might detach the binds itself before
// Allow and detachView (EINVAL, "gone") never make them noexec. HELD: the
// cwd's mount is noexec after the reload. A shell standing in /workspace/bin then tries to execute from
// its cwd after the reload made /workspace/bin/ DM-less (guild only).
func TestViewBinaryCwdAcrossReload(t *testing.T) {
	rules := strings.Replace(viewBinRules, `"/usr/bin/tr",`, `"/usr/bin/tr", "/usr/bin/python3",`, 1)
	d := binHome(t, rules)
	_, stdin, lines := binShell(t, d, `cd /workspace/bin && ./hello.sh && echo ready
read x; python3 -c 'import os; print("cwd noexec:", bool(os.statvfs(".").f_flag & 8))'
./hello.sh; echo "sh: $?"; ./true; echo "elf: $?"; /lib64/ld-linux-x86-64.so.2 ./true; echo "ld: $?"; /workspace/bin/hello.sh; echo "bypath: $?"; echo end`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	d.Home.Write("config/conditions.toml", strings.Replace(rules, `when = "discord:dm"
action = "allow"
`, `when = "discord:guild:1"
action = "allow"
`, -1))
	for i := 0; i < 100 && !strings.Contains(d.Log(), "conditions reloaded"); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, "hello-from-view") || strings.Contains(o, "elf: 0") || strings.Contains(o, "ld: 0") {
		t.Errorf("BROKE: executed from the cwd after the reload disallowed it")
	}
}

// TestViewBinaryRenamedOverNeverExecutes (C4): the agent (65534, through its own
// view, outside the run) renames another file over the listed, bound
// /workspace/tool.sh: the kernel detaches the run's bind on that dentry
// itself (a mount point in another namespace), so it is never made
// noexec (detachView: EINVAL, "gone"). A process of the run holding the
// old file (a descriptor, through the bind) tries to execute it after a
// switch that disallows tool.sh.
func TestViewBinaryRenamedOverNeverExecutes(t *testing.T) {
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/workspace/tool.sh"]

[exec."/workspace/tool.sh"]
when = "discord:dm"
action = "allow"
`
	d := binHome(t, rules)
	d.Home.Write("workspace/other.sh", "#!/bin/sh\necho other\n")
	os.Chmod(d.Home.Path("workspace/other.sh"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	mnt := d.Home.Path("mnt/s")
	_, stdin, lines := binShell(t, d, `exec 3< /workspace/tool.sh; /proc/self/fd/3; echo ready
read x; python3 -c 'import os; print("fd noexec:", bool(os.fstatvfs(3).f_flag & 8))'
/proc/self/fd/3; echo "fd: $?"; python3 -c 'import os; os.execve(3, ["x"], {})'; echo "fexecve: $?"; /workspace/tool.sh; echo "path: $?"; echo end`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok || !strings.Contains(o, "tool-ran") {
		t.Fatalf("%q", o)
	}
	// The listed file is read-only through the view: the rename over it,
	// which had the kernel detach the run's bind, is refused.
	if out, err := testenv.CommandAs(testenv.Nobody, "mv", mnt+"/workspace/other.sh", mnt+"/workspace/tool.sh").CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only file system") {
		t.Errorf("mv over a listed file through the view: %v %s", err, out)
	}
	d.SetContext("s", testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, "tool-ran") || strings.Contains(o, "other") && !strings.Contains(o, "other.sh") {
		t.Errorf("BROKE")
	}
}

// TestViewBinaryRenamedOverNeverMapsExecutable (C5): as C4, but the held descriptor
// is mapped executable (mmap PROT_EXEC checks only the mount's noexec,
// which the kernel-detached bind never got; Landlock checks no mmap), and
// the mapped bytes are called: code of /workspace/tool (exec rule: DMs
// only) runs after the switch to a guild has returned.
func TestViewBinaryRenamedOverNeverMapsExecutable(t *testing.T) {
	for _, mode := range []string{"control", "agent-renames-over", "backing-renamed-over"} {
		t.Run(mode, func(t *testing.T) { kernelDetachedMmap(t, mode) })
	}
}

// kernelDetachedMmap: "control" changes nothing before the switch;
// "agent-renames-over" saves over the listed file through the view (now
// refused); "backing-renamed-over" does it in the backing tree, outside
// every view, and a stat through the view has the kernel drop the run's
// bind itself: the switch that withdraws it then kills the run.
func kernelDetachedMmap(t *testing.T, mode string) {
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/workspace/tool"]

[exec."/workspace/tool"]
when = "discord:dm"
action = "allow"
`
	d := binHome(t, rules)
	// tool: machine code "mov eax, 42; ret" (a stand-in for any program's
	// text), and a replacement for the agent's editor to save over it.
	d.Home.Write("workspace/tool", "\xb8\x2a\x00\x00\x00\xc3")
	d.Home.Write("workspace/tool.new", "#!/bin/sh\necho new\n")
	os.Chmod(d.Home.Path("workspace/tool"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	mnt := d.Home.Path("mnt/s")
	_, stdin, lines := binShell(t, d, `python3 -c '
import os, mmap, ctypes, sys
fd = os.open("/workspace/tool", os.O_RDONLY)  # through the bind, while allowed
print("ready", flush=True)
sys.stdin.readline()
print("fd noexec:", bool(os.fstatvfs(fd).f_flag & 8), flush=True)
try:
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_EXEC)
except Exception as e:
    print("mmap exec:", e, flush=True); sys.exit(0)
ino = str(os.fstat(fd).st_ino)
for l in open("/proc/self/maps"):
    f = l.split()
    if len(f) >= 6 and "x" in f[1] and f[4] == ino:
        print("mapped executable:", l.strip(), flush=True)
        print("called:", ctypes.CFUNCTYPE(ctypes.c_int)(int(f[0].split("-")[0], 16))(), flush=True)
        break
'; echo end`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	switch mode {
	case "backing-renamed-over":
		if err := os.Rename(d.Home.Path("workspace/tool.new"), d.Home.Path("workspace/tool")); err != nil {
			t.Fatal(err)
		}
		testenv.CommandAs(testenv.Nobody, "stat", mnt+"/workspace/tool").Run()
	case "agent-renames-over":
		// The agent's editor saves by rename over the file, through its view.
		// Refused now: the listed file is read-only through the view.
		if out, err := testenv.CommandAs(testenv.Nobody, "mv", mnt+"/workspace/tool.new", mnt+"/workspace/tool").CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only file system") {
			t.Errorf("mv over a listed file through the view: %v %s", err, out)
		}
	}
	d.SetContext("s", testenv.Guild)
	var res map[string]any
	d.Call("path.check", map[string]any{"space": "exec", "path": "/workspace/tool", "context": testenv.Guild}, &res)
	t.Logf("path.check exec /workspace/tool in a guild: %v", res["decision"])
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, "called: 42") {
		t.Errorf("BROKE: code of /workspace/tool mapped executable and run after the switch disallowed it")
	}
}

// TestViewBinaryRunCannotDetachItsBind (C6): can the run itself have the
// kernel take its bind away (never made noexec)? It holds the listed
// /workspace/sub/tool open through the bind, renames /workspace/sub (no
// mount point) and looks the file up again under the new name, then a
// switch disallows it.
func TestViewBinaryRunCannotDetachItsBind(t *testing.T) {
	rules := testenv.PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/python3", "/workspace/sub/tool"]

[exec."/workspace/sub/tool"]
when = "discord:dm"
action = "allow"
`
	d := binHome(t, rules)
	d.Home.Write("workspace/sub/tool", "\xb8\x2a\x00\x00\x00\xc3")
	os.Chmod(d.Home.Path("workspace/sub/tool"), 0o755)
	testenv.ChownTree(t, d.Home.Path("workspace"), testenv.Nobody)
	_, stdin, lines := binShell(t, d, `python3 -c '
import os, mmap, ctypes, sys
fd = os.open("/workspace/sub/tool", os.O_RDONLY)
try:
    os.rename("/workspace/sub", "/workspace/sub2")
except OSError as e:
    print("rename:", e.strerror, flush=True)
for i in range(50):
    try: os.stat("/workspace/sub2/tool"); os.listdir("/workspace/sub2")
    except Exception as e: print("stat:", e)
print("noexec now:", bool(os.fstatvfs(fd).f_flag & 8), "mounts:", [l.split()[4] for l in open("/proc/self/mountinfo") if "/workspace/" in l.split()[4]], flush=True)
print("ready", flush=True)
sys.stdin.readline()
print("fd noexec:", bool(os.fstatvfs(fd).f_flag & 8), flush=True)
try:
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_EXEC)
    print("mmap exec: ok", flush=True)
except Exception as e:
    print("mmap exec:", e, flush=True)
'; echo end`)
	if o, ok := waitLine(t, lines, "ready", 20*time.Second); !ok {
		t.Fatalf("%q", o)
	} else {
		t.Logf("%s", o)
	}
	d.SetContext("s", testenv.Guild)
	io.WriteString(stdin, "go\n")
	o, _ := waitLine(t, lines, "end", 20*time.Second)
	t.Logf("%s", o)
	if strings.Contains(o, "mmap exec: ok") {
		t.Errorf("BROKE: mapped executable after the switch, the run alone")
	}
}
