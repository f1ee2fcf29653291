package control

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Descriptors and takeovers: what `condfs run` needs of the socket.
//
// A client may send file descriptors (SCM_RIGHTS) with the bytes of a
// request line; a handler takes them with TakeFiles. At most MaxFiles are
// kept per connection at a time (the rest are closed as they arrive), and
// every descriptor a handler did not take is closed once its request is
// answered, so a client can never park descriptors in the daemon.
//
// A handler may answer with a Takeover instead of a result: the connection
// is then the takeover's until it returns (it answers the request itself),
// and closed after. The connection keeps its slot, busy, meanwhile.

// MaxFiles bounds the descriptors one connection may have in flight.
const MaxFiles = 3

// fdConn reads a Unix connection with recvmsg, keeping the descriptors
// that arrive (close-on-exec: Go asks for MSG_CMSG_CLOEXEC).
type fdConn struct {
	c   *net.UnixConn
	srv *Server
	uid uint32
	oob []byte
	mu  sync.Mutex
	fds []int
	// lost: descriptors came beyond MaxFiles (closed) or were truncated
	// since the last take
	lost bool
}

func newFDConn(c *net.UnixConn, srv *Server, uid uint32) *fdConn {
	return &fdConn{c: c, srv: srv, uid: uid, oob: make([]byte, unix.CmsgSpace(4*MaxFiles))}
}

func (f *fdConn) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := f.c.ReadMsgUnix(p, f.oob)
	if oobn > 0 {
		f.keep(f.oob[:oobn])
	}
	if flags&unix.MSG_CTRUNC != 0 {
		f.mu.Lock()
		f.lost = true
		f.mu.Unlock()
	}
	return max(n, 0), err // recvmsg's -1 on an error is no count
}

// keep takes the descriptors of a control message; beyond MaxFiles they
// are closed at once. Truncated messages lose nothing but their extra
// descriptors, which the kernel closes.
func (f *fdConn) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(f.fds) < MaxFiles {
				f.fds = append(f.fds, fd)
			} else {
				f.lost = true
				f.srv.release(f.uid, fd)
			}
		}
	}
}

// take hands over the descriptors kept, and whether any beyond them were
// lost.
func (f *fdConn) take() ([]int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fds, lost := f.fds, f.lost
	f.fds, f.lost = nil, false
	return fds, lost
}

// drop closes what no handler took.
func (f *fdConn) drop() {
	fds, _ := f.take()
	for _, fd := range fds {
		f.srv.release(f.uid, fd)
	}
}

// closersPerUID bounds the threads closing one uid's descriptors.
const closersPerUID = 2

// release closes a descriptor a peer sent, on the closers of the peer's
// uid. A close can block for as long as the peer likes (a socket lingering
// on unsent data, a file of a FUSE mount whose server hangs in FLUSH): each
// uid's closes hold at most closersPerUID threads, and when they are stuck
// the uid's own connections wait to hand over more, as goroutines, while
// every other uid's descriptors are closed by their own closers.
func (s *Server) release(uid uint32, fd int) {
	s.closeMu.Lock()
	if s.closeQ == nil {
		s.closeQ = map[uint32]chan int{}
	}
	ch := s.closeQ[uid]
	if ch == nil {
		ch = make(chan int, 64)
		s.closeQ[uid] = ch
		for range closersPerUID {
			s.closers.Add(1)
			go func() {
				defer s.closers.Done()
				for fd := range ch {
					unix.Close(fd)
				}
			}()
		}
	}
	s.closeMu.Unlock()
	ch <- fd
}

// stopClosers ends the closers once no connection is left to send them
// anything (Close).
func (s *Server) stopClosers() {
	s.closeMu.Lock()
	for uid, ch := range s.closeQ {
		close(ch)
		delete(s.closeQ, uid)
	}
	s.closeMu.Unlock()
	s.closers.Wait()
}

// Release closes files a handler took (TakeFiles) and no longer needs,
// as the socket closes those it did not take: on the closers of the
// client's uid, never on the handler's goroutine.
func Release(ctx context.Context, files []*os.File) {
	f, _ := ctx.Value(filesKey{}).(*fdConn)
	for _, file := range files {
		if f == nil {
			file.Close()
			continue
		}
		// The File gives up its descriptor (no finalizer closes it again).
		fd, err := dupAndClose(file)
		if err == nil {
			f.srv.release(f.uid, fd)
		}
	}
}

// dupAndClose hands over file's descriptor as a plain number.
func dupAndClose(file *os.File) (int, error) {
	raw, err := file.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	raw.Control(func(u uintptr) { fd, derr = unix.FcntlInt(u, unix.F_DUPFD_CLOEXEC, 0) })
	if derr != nil {
		return -1, derr
	}
	file.Close() // the original number: not the last reference, never blocks
	return fd, nil
}

type filesKey struct{}

// TakeFiles returns the descriptors the client sent with the request being
// handled (nil if none), now the caller's to close, and whether all it sent
// are there: more than MaxFiles were sent (the rest closed) or some were
// truncated otherwise. A handler refuses such a request rather than act
// on a part of what was sent.
func TakeFiles(ctx context.Context) (files []*os.File, all bool) {
	f, _ := ctx.Value(filesKey{}).(*fdConn)
	if f == nil {
		return nil, true
	}
	fds, lost := f.take()
	for _, fd := range fds {
		files = append(files, os.NewFile(uintptr(fd), "passed"))
	}
	return files, !lost
}

// Stream is what a Takeover gets: the connection, the reader that has
// buffered what followed the request, and the request's id.
type Stream struct {
	Conn *net.UnixConn
	R    *bufio.Reader
	ID   []byte
	w    *bufio.Writer
	srv  *Server
	// notify: the request was a notification; nothing is answered.
	notify bool
}

// Takeover answers a request by taking the connection over (see above).
type Takeover func(ctx context.Context, s *Stream)

// Respond writes the answer to the request that was taken over.
func (s *Stream) Respond(result any, err *Error) error {
	if s.notify {
		return nil
	}
	if !s.srv.write(s.Conn, s.w, response{ID: s.ID, Result: result, Error: err}) {
		return errors.New("the client does not read its answer")
	}
	return nil
}
