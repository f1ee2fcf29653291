package runs

import (
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestInitSurvivesEverySignalPath: the command toward its init (pid 1 of the run's
// PID namespace, a Go program: a SIGSEGV it did not raise itself crashes
// it): kill, pidfd_send_signal, a SIGIO owner (F_SETOWN, F_SETSIG SIGSEGV),
// pidfd_getfd, process_vm_readv, /proc/1/environ.
func TestInitSurvivesEverySignalPath(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	inner := `
import ctypes, fcntl, os, signal, socket, time
libc = ctypes.CDLL(None, use_errno=True)
def sc(*args):
    r = libc.syscall(*[ctypes.c_long(x) for x in args])
    return r, os.strerror(ctypes.get_errno()) if r < 0 else "ok"
print("kill SEGV", sc(62, 1, 11), flush=True)
r, e = sc(434, 1, 0)
print("pidfd_open(1)", r, e, flush=True)
if r >= 0:
    print("pidfd_send_signal SEGV", sc(424, r, 11, 0, 0), flush=True)
    for fd in range(0, 12):
        g, ge = sc(438, r, fd, 0)
        if g >= 0:
            print("pidfd_getfd got init fd", fd, os.readlink("/proc/self/fd/%d" % g), flush=True)
buf = ctypes.create_string_buffer(16)
class iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
l, rm = iov(ctypes.cast(buf, ctypes.c_void_p), 16), iov(0x400000, 16)
print("process_vm_readv", sc(310, 1, ctypes.addressof(l), 1, ctypes.addressof(rm), 1, 0), flush=True)
try:
    print("environ of init:", open("/proc/1/environ", "rb").read()[:40], flush=True)
except OSError as e:
    print("environ", e.strerror, flush=True)
x, y = socket.socketpair()
try:
    fcntl.fcntl(x, fcntl.F_SETOWN, 1)
    fcntl.fcntl(x, 10, signal.SIGSEGV)  # F_SETSIG
    fcntl.fcntl(x, fcntl.F_SETFL, fcntl.fcntl(x, fcntl.F_GETFL) | os.O_ASYNC)
    y.send(b"z")
    print("sigio armed to pid 1", flush=True)
except OSError as e:
    print("sigio", e.strerror, flush=True)
try:
    fcntl.fcntl(x, fcntl.F_SETOWN, 0)
    fcntl.fcntl(x, fcntl.F_SETOWN, -1)  # pgid 1
    y.send(b"z")
    print("sigio armed to pgrp 1", flush=True)
except OSError as e:
    print("sigio pgrp", e.strerror, flush=True)
time.sleep(1.5)
print("alive", flush=True)
print(open("/memories/pub.md").read(), end="", flush=True)
`
	out, code := a.Run(t, "", "python3", "-c", inner)
	t.Logf("(%d) %s", code, out)
	if strings.Contains(out, "pidfd_getfd got init fd") {
		t.Errorf("HOLE: the command took a descriptor of its init (pidfd_getfd)")
	}
	if strings.Contains(out, "environ of init: b'") && !strings.Contains(out, "environ of init: b''") {
		t.Errorf("HOLE: the command read its init's environment")
	}
	if strings.Contains(out, "process_vm_readv (16") {
		t.Errorf("HOLE: the command read its init's memory")
	}
	if strings.Contains(out, "goroutine ") || !strings.Contains(out, "alive\npublic") || code != 0 {
		t.Errorf("HOLE: the command's signals crashed or stopped its init (%d)", code)
	}
	if o, c := a.Run(t, "", "cat", "/memories/pub.md"); c != 0 || o != "public\n" {
		t.Errorf("after the attack the session's next run: %d %q\n%s", c, o, testenv.Tail(a.Logs(), 20))
	}
}

// TestInitProcEntriesClosedToTheCommand: on this path the init has the command's uid. Its
// /proc entries (its executable: the daemon's binary, on an exec host
// mount; its descriptors: the channel to the daemon) must stay closed.
func TestInitProcEntriesClosedToTheCommand(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	out, code := a.Run(t, "", "python3", "-c", `
import os
def tr(name, f):
    try:
        print(name, "OK", f(), flush=True)
    except OSError as e:
        print(name, e.strerror, flush=True)
tr("readlink exe", lambda: os.readlink("/proc/1/exe"))
tr("open exe", lambda: os.open("/proc/1/exe", os.O_RDONLY))
tr("list fd", lambda: os.listdir("/proc/1/fd"))
tr("open fd3", lambda: os.open("/proc/1/fd/3", os.O_RDWR))
tr("root", lambda: os.listdir("/proc/1/root"))
tr("cwd", lambda: os.listdir("/proc/1/cwd"))
tr("environ", lambda: open("/proc/1/environ","rb").read()[:40])
tr("mem", lambda: os.open("/proc/1/mem", os.O_RDONLY))
tr("map_files", lambda: os.listdir("/proc/1/map_files"))
tr("status", lambda: [l for l in open("/proc/1/status") if l.startswith(("Uid", "CapEff", "CapBnd"))])
tr("self caps", lambda: [l for l in open("/proc/self/status") if l.startswith(("Uid", "CapEff", "CapPrm", "CapAmb", "CapBnd", "NoNewPrivs", "Seccomp"))])
tr("uid_map", lambda: open("/proc/self/uid_map").read())
tr("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
`)
	t.Logf("(%d)\n%s", code, out)
	for _, l := range strings.Split(out, "\n") {
		if (strings.HasPrefix(l, "open exe OK") || strings.HasPrefix(l, "open fd3 OK") || strings.HasPrefix(l, "list fd OK") ||
			strings.HasPrefix(l, "root OK") || strings.HasPrefix(l, "mem OK") || strings.HasPrefix(l, "environ OK")) && !strings.Contains(l, "'/'") {
			t.Errorf("HOLE: the init's /proc entry is open to the command: %s", l)
		}
	}
	// The ELF interpreter on the init's executable (the daemon's binary).
	o2, c2 := a.Run(t, "", "sh", "-c", "/lib64/ld-linux-x86-64.so.2 /proc/1/exe --help; echo st=$?")
	t.Logf("ld.so /proc/1/exe (%d): %q", c2, o2)
	if strings.Contains(o2, "Usage") || strings.Contains(o2, "condfs") && !strings.Contains(o2, "cannot") {
		t.Errorf("HOLE: the daemon's binary ran in the run through /proc/1/exe")
	}
}

// TestInitIgnoresCrashSignalsFromTheCommand: the command may signal its init on this path. The
// init drops the signals that end a Go program by default; the ones the Go
// runtime turns into a crash when sent by kill (SIGSEGV, SIGBUS, SIGFPE,
// SIGABRT, SIGILL, SIGTRAP, SIGSYS) are tried one per run: the run may end,
// nothing else may (the daemon, the session's next run).
func TestInitIgnoresCrashSignalsFromTheCommand(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	for _, sig := range []string{"SEGV", "ABRT", "SYS", "TRAP", "XCPU", "ALRM", "TSTP", "CONT"} {
		out, code := a.Run(t, "", "sh", "-c", "kill -"+sig+" 1; echo sent=$?; sleep 1; echo alive; cat /memories/pub.md")
		if len(out) > 600 {
			out = out[:600] + "..."
		}
		t.Logf("SIG%s (%d): %q", sig, code, out)
		if strings.Contains(out, "goroutine ") {
			t.Logf("SIG%s: the init's crash dump reached the command's stderr", sig)
		}
		if o, c := a.Run(t, "", "cat", "/memories/pub.md"); c != 0 || o != "public\n" {
			t.Fatalf("after SIG%s the session's next run: %d %q\n%s", sig, c, o, testenv.Tail(a.Logs(), 20))
		}
	}
}
