package sandbox

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// pty is a terminal of the run's own devpts instance, for a Command with
// TTY: its slave is the command's stdio and controlling terminal, and the
// init relays between its master and the stdio the client passed. The
// command never holds the client's descriptors (its terminal, say), so
// nothing it does (TIOCSTI included) reaches the caller's terminal.
type pty struct {
	master *os.File
	slave  int
	out    chan struct{} // closed when the master's output is drained
	moved  atomic.Int64  // unix nanoseconds of the last output relayed
}

// openPTY opens a new pts of the run's devpts (mounted by buildDev) as the
// owner's, sized rows x cols.
func openPTY(spec Spec, rows, cols uint16) (*pty, error) {
	m, err := unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/pts/ptmx: %w", err)
	}
	fail := func(what string, err error) (*pty, error) {
		unix.Close(m)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock the pts", err)
	}
	// The slave comes from the master itself (no path to look up).
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("open the pts", errno)
	}
	// A root daemon's init made it root's: the command's own terminal is
	// the owner's (mode 0620 of the devpts mount).
	if uint32(os.Getuid()) != spec.UID {
		if err := unix.Fchown(int(s), int(spec.UID), int(spec.GID)); err != nil {
			unix.Close(int(s))
			return fail("give the pts to its owner", err)
		}
	}
	p := &pty{slave: int(s), out: make(chan struct{})}
	if rows > 0 && cols > 0 {
		if err := p.resizeFd(m, rows, cols); err != nil {
			unix.Close(int(s))
			return fail("size the pts", err)
		}
	}
	p.master = os.NewFile(uintptr(m), "ptmx")
	return p, nil
}

func (p *pty) resizeFd(fd int, rows, cols uint16) error {
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// resize sets the terminal's size; the kernel tells the command's
// foreground group (SIGWINCH).
func (p *pty) resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errors.New("a terminal size needs rows and columns")
	}
	return p.resizeFd(int(p.master.Fd()), rows, cols)
}

// relay starts copying stdin (the init's 0) to the terminal and the
// terminal's output to stdout (the init's 1), once the command holds the
// slave (the init's own copy is closed here: the master reads EIO once the
// run's last holder is gone).
func (p *pty) relay() {
	unix.Close(p.slave)
	p.moved.Store(time.Now().UnixNano())
	in, out := os.NewFile(0, "stdin"), os.NewFile(1, "stdout")
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				if _, werr := p.master.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				// The caller's input ended (a pipe, /dev/null): the
				// terminal's end-of-file character tells a reader in
				// canonical mode, as script(1) does.
				if t, terr := unix.IoctlGetTermios(int(p.master.Fd()), unix.TCGETS); terr == nil {
					_, _ = p.master.Write([]byte{t.Cc[unix.VEOF]})
				}
				return
			}
		}
	}()
	go func() {
		defer close(p.out)
		buf := make([]byte, 32<<10)
		for {
			n, err := p.master.Read(buf)
			if n > 0 {
				if _, werr := out.Write(buf[:n]); werr != nil {
					return
				}
				p.moved.Store(time.Now().UnixNano())
			}
			if err != nil {
				return // EIO: no process of the run holds the slave
			}
		}
	}()
}

// drainIdle bounds drain when output stops moving while something outside
// the run's processes (all gone by then) still holds the slave.
const drainIdle = 2 * time.Second

// drain waits, once every process of the run is gone, until what the
// command wrote to its terminal has reached stdout.
func (p *pty) drain() {
	t := time.NewTicker(drainIdle / 4)
	defer t.Stop()
	for {
		select {
		case <-p.out:
			return
		case <-t.C:
			if time.Since(time.Unix(0, p.moved.Load())) > drainIdle {
				return
			}
		}
	}
}
