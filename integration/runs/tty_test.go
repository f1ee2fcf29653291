package runs

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// ttyRules: runRules' binaries and the terminal tools.
var ttyRules = strings.Replace(testenv.RunRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/stty", "/usr/bin/tty"]`, 1)

// hostPTY is a terminal of the host's devpts for condfs run to run on: the
// test holds its master, the client gets its slave as stdio and
// controlling terminal.
type hostPTY struct {
	master, slave *os.File
	mu            sync.Mutex
	out           strings.Builder
}

func openHostPTY(t *testing.T, rows, cols uint16) *hostPTY {
	t.Helper()
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		t.Fatal(errno)
	}
	if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	p := &hostPTY{master: os.NewFile(uintptr(m), "ptmx"), slave: os.NewFile(s, "pts")}
	t.Cleanup(func() { p.master.Close(); p.slave.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := p.master.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return p
}

func (p *hostPTY) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs condfs run as 65534 on the terminal, as its session leader.
func (p *hostPTY) start(t *testing.T, d *testenv.Daemon, args ...string) *exec.Cmd {
	t.Helper()
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), append([]string{"run", "--socket", d.Socket, "--session", "s", "--tty"}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.slave, p.slave, p.slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestRunTTY: --tty gives the command a terminal of its own (the run's own
// devpts, not the caller's), sized as the caller's and following it, with
// the caller's terminal in raw mode while it runs (so ^C is the command
// terminal's own interrupt) and given back after; without a terminal the
// same pts is relayed to and from pipes.
func TestRunTTY(t *testing.T) {
	d, _ := testenv.RunHomeWith(t, ttyRules)
	p := openHostPTY(t, 33, 77)
	before, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	// Its own terminal: cooked (the caller's is raw meanwhile), owned
	// by the run's uid, the only pts of the run's devpts.
	cmd := p.start(t, d, "--", "sh", "-c",
		`tty; stty size; stty -a | tr ' ' '\n' | tr -d ';' | while read w; do case $w in icanon|-icanon) echo mode=$w;; esac; done; ls -n /dev/pts; echo ready; trap 'stty size; exit 7' WINCH; while :; do sleep 0.1; done`)
	d.Within("the command is ready", func() bool { return strings.Contains(p.output(), "ready") })
	raw, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("the caller's terminal is not raw while the run goes on: lflag %#x", raw.Lflag)
	}
	out := p.output()
	for _, want := range []string{"/dev/pts/0\r\n", "33 77\r\n", "mode=icanon\r\n", " 65534 ", " 0\r\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the run: no %q in %q", want, out)
		}
	}
	if strings.Contains(out, " 1\r\n") {
		t.Errorf("the run's devpts holds another terminal: %q", out)
	}
	// The caller's terminal changes size: the command's follows.
	if err := unix.IoctlSetWinsize(int(p.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 120}); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, "condfs run --tty did not end"); code != 7 || !strings.Contains(p.output(), "50 120\r\n") {
		t.Errorf("after a resize: exit %d, output %q", code, p.output())
	}
	after, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if after.Lflag != before.Lflag || after.Iflag != before.Iflag || after.Oflag != before.Oflag {
		t.Errorf("the caller's terminal is not given back: %+v, was %+v", after, before)
	}

	// ^C typed at the caller's terminal is the command terminal's
	// interrupt: SIGINT ends sleep (130).
	p = openHostPTY(t, 24, 80)
	cmd = p.start(t, d, "--", "sh", "-c", "echo ready; exec sleep 30")
	d.Within("sleep runs", func() bool { return strings.Contains(p.output(), "ready") })
	time.Sleep(100 * time.Millisecond) // the exec after the echo
	p.master.Write([]byte{3})
	if code := waitExit(t, cmd, "condfs run --tty did not end"); code != 130 {
		t.Errorf("^C: exit %d, want 130; output %q", code, p.output())
	}

	// No terminal at all: pipes relayed to and from the run's pts.
	if out, code := testenv.CondfsRun(t, d, "hello\n", "--tty", "--", "sh", "-c", "tty; read x; echo got $x"); code != 0 ||
		!strings.Contains(out, "/dev/pts/0\r\n") || !strings.Contains(out, "got hello\r\n") {
		t.Errorf("--tty on pipes: exit %d %q", code, out)
	}
	// Without --tty the command has no terminal.
	if out, code := testenv.CondfsRun(t, d, "", "--", "tty"); code != 1 || !strings.Contains(out, "not a tty") {
		t.Errorf("no --tty: exit %d %q", code, out)
	}
}
