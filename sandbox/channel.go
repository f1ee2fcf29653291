package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The daemon and the init talk over a stream socketpair in JSON lines.
//
// daemon -> init: spec (once, first), run (once, after ready, with the
// command's stdin, stdout and stderr attached as SCM_RIGHTS), allow,
// signal, resize (of the command's terminal), again (after exit: ready
// the sandbox for another command; answered by ready or error, and then a
// run as before).
// init -> daemon: ready or error (answering spec: the root is built and the
// init waits for its command), started or error (answering run), ack
// (answering allow, same id), exit (the command's status, just before the
// init exits).
type message struct {
	Op     string    `json:"op"`
	Spec   *initSpec `json:"spec,omitempty"`
	Cmd    *Command  `json:"cmd,omitempty"`
	ID     uint64    `json:"id,omitempty"`
	Paths  []string  `json:"paths,omitempty"`
	Sig    int       `json:"sig,omitempty"`
	Step   string    `json:"step,omitempty"`
	Err    string    `json:"err,omitempty"`
	Errno  int       `json:"errno,omitempty"` // with Err: the errno behind it, if any
	Code   int       `json:"code,omitempty"`
	Signal int       `json:"signal,omitempty"`
	Rows   uint16    `json:"rows,omitempty"`
	Cols   uint16    `json:"cols,omitempty"`

	fds []int // received with it (a run's stdio), in the init
}

const (
	opSpec    = "spec"
	opRun     = "run"
	opAllow   = "allow"
	opSignal  = "signal"
	opResize  = "resize"
	opAgain   = "again"
	opReady   = "ready"
	opStarted = "started"
	opError   = "error"
	opAck     = "ack"
	opExit    = "exit"
)

// maxMessage bounds one line: a Spec with its binaries fits many times over.
const maxMessage = 4 << 20

// maxPassed bounds the descriptors one message may carry (the run's stdio;
// the egress gateway's socket).
const maxPassed = 3

type channel struct {
	mu  sync.Mutex // serialises writes
	f   *os.File
	rd  *fdReader
	dec *bufio.Scanner
}

func newChannel(f *os.File) *channel {
	rd := &fdReader{f: f}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), maxMessage)
	return &channel{f: f, rd: rd, dec: sc}
}

func (c *channel) send(m message) error { return c.sendFiles(m, nil) }

// sendFiles sends m with fds attached to its first byte.
func (c *channel) sendFiles(m message, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.Op, err)
	}
	b = append(b, '\n')
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(fds) == 0 {
		if _, err := c.f.Write(b); err != nil {
			return fmt.Errorf("send %s: %w", m.Op, err)
		}
		return nil
	}
	rc, err := c.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("send %s: %w", m.Op, err)
	}
	oob := unix.UnixRights(fds...)
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		var n int
		n, serr = unix.SendmsgN(int(fd), b, oob, nil, 0)
		if serr == unix.EAGAIN {
			return false
		}
		if serr == nil {
			b = b[n:]
		}
		return true
	}); err != nil {
		return fmt.Errorf("send %s: %w", m.Op, err)
	}
	if serr != nil {
		return fmt.Errorf("send %s: %w", m.Op, serr)
	}
	if len(b) > 0 {
		// The descriptors went with the first part; the rest is plain.
		if _, err := c.f.Write(b); err != nil {
			return fmt.Errorf("send %s: %w", m.Op, err)
		}
	}
	return nil
}

// recv reads the next message; only one goroutine may call it.
func (c *channel) recv() (message, error) {
	if !c.dec.Scan() {
		if err := c.dec.Err(); err != nil {
			return message{}, err
		}
		return message{}, io.EOF
	}
	var m message
	if err := json.Unmarshal(c.dec.Bytes(), &m); err != nil {
		return message{}, fmt.Errorf("decode: %w", err)
	}
	return m, nil
}

// takeFiles returns the descriptors received so far (close-on-exec), and
// forgets them.
func (c *channel) takeFiles() []int {
	c.rd.mu.Lock()
	defer c.rd.mu.Unlock()
	fds := c.rd.fds
	c.rd.fds = nil
	return fds
}

// fdReader reads the socket with recvmsg, so descriptors sent with the
// bytes are kept rather than dropped (read(2) would close them). A sender
// that attaches more than maxPassed in all has them closed, and the
// reader fails.
type fdReader struct {
	f  *os.File
	mu sync.Mutex
	// fds received and not yet taken
	fds []int
}

func (r *fdReader) Read(p []byte) (int, error) {
	rc, err := r.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	oob := make([]byte, unix.CmsgSpace(4*maxPassed))
	var n, oobn, flags int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), p, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if oobn > 0 {
		var got []int
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if fds, err := unix.ParseUnixRights(&cm); err == nil {
					got = append(got, fds...)
				}
			}
		}
		r.mu.Lock()
		r.fds = append(r.fds, got...)
		tooMany := len(r.fds) > maxPassed || flags&unix.MSG_CTRUNC != 0
		if tooMany {
			for _, fd := range r.fds {
				unix.Close(fd)
			}
			r.fds = nil
		}
		r.mu.Unlock()
		if tooMany {
			return 0, errors.New("too many descriptors passed")
		}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}
