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
	wake   int           // written to stop the input copy
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
// run's last holder is gone). Both copies work on descriptors of their
// own: the init's 0 and 1 are given to the next command's stdio.
func (p *pty) relay() error {
	unix.Close(p.slave)
	p.moved.Store(time.Now().UnixNano())
	in, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return err
	}
	out, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		unix.Close(in)
		return err
	}
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC); err != nil {
		unix.Close(in)
		unix.Close(out)
		return err
	}
	p.wake = wake[1]
	go func() {
		defer unix.Close(in)
		defer unix.Close(wake[0])
		buf := make([]byte, 32<<10)
		for {
			// Polled with the wake pipe: once the command is gone
			// this copy stops, and reads no more of the caller's
			// input (a key typed at the caller's shell after the run).
			fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(wake[0]), Events: unix.POLLIN}}
			if _, err := unix.Poll(fds, -1); err != nil {
				if err == unix.EINTR {
					continue
				}
				return
			}
			if fds[1].Revents != 0 {
				return
			}
			n, err := unix.Read(in, buf)
			if n > 0 {
				if _, werr := p.master.Write(buf[:n]); werr != nil {
					return
				}
			}
			if n == 0 || (err != nil && err != unix.EINTR && err != unix.EAGAIN) {
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
		defer unix.Close(out)
		buf := make([]byte, 32<<10)
		for {
			n, err := p.master.Read(buf)
			for b := buf[:n]; len(b) > 0; {
				w, werr := unix.Write(out, b)
				if werr == unix.EINTR {
					continue
				}
				if werr != nil {
					return
				}
				b = b[w:]
				p.moved.Store(time.Now().UnixNano())
			}
			if err != nil {
				return // EIO: no process of the run holds the slave
			}
		}
	}()
	return nil
}

// drainIdle bounds drain when output stops moving while something outside
// the run's processes (all gone by then) still holds the slave.
const drainIdle = 2 * time.Second

// finish waits, once every process of the run is gone, until what the
// command wrote to its terminal has reached stdout, then stops the input
// copy and closes the terminal.
func (p *pty) finish() {
	t := time.NewTicker(drainIdle / 4)
	defer t.Stop()
drain:
	for {
		select {
		case <-p.out:
			break drain
		case <-t.C:
			if time.Since(time.Unix(0, p.moved.Load())) > drainIdle {
				break drain
			}
		}
	}
	_, _ = unix.Write(p.wake, []byte{0})
	unix.Close(p.wake)
	p.master.Close()
}
