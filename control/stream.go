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
	oob []byte
	mu  sync.Mutex
	fds []int
}

func newFDConn(c *net.UnixConn) *fdConn {
	return &fdConn{c: c, oob: make([]byte, unix.CmsgSpace(4*MaxFiles))}
}

func (f *fdConn) Read(p []byte) (int, error) {
	n, oobn, _, _, err := f.c.ReadMsgUnix(p, f.oob)
	if oobn > 0 {
		f.keep(f.oob[:oobn])
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
				closeAsync(fd)
			}
		}
	}
}

// take hands over the descriptors kept.
func (f *fdConn) take() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	fds := f.fds
	f.fds = nil
	return fds
}

// drop closes what no handler took.
func (f *fdConn) drop() {
	for _, fd := range f.take() {
		closeAsync(fd)
	}
}

// closeAsync closes fd off the caller's goroutine: closing a file of a
// FUSE mount whose server hangs blocks in FLUSH, and a peer chose the file.
func closeAsync(fd int) { go unix.Close(fd) }

type filesKey struct{}

// TakeFiles returns the descriptors the client sent with the request being
// handled (nil if none), now the caller's to close.
func TakeFiles(ctx context.Context) []*os.File {
	f, _ := ctx.Value(filesKey{}).(*fdConn)
	if f == nil {
		return nil
	}
	var files []*os.File
	for _, fd := range f.take() {
		files = append(files, os.NewFile(uintptr(fd), "passed"))
	}
	return files
}

// Stream is what a Takeover gets: the connection, the reader that has
// buffered what followed the request, and the request's id.
type Stream struct {
	Conn *net.UnixConn
	R    *bufio.Reader
	ID   []byte
	w    *bufio.Writer
	srv  *Server
}

// Takeover answers a request by taking the connection over (see above).
type Takeover func(ctx context.Context, s *Stream)

// Respond writes the answer to the request that was taken over.
func (s *Stream) Respond(result any, err *Error) error {
	if !s.srv.write(s.Conn, s.w, response{ID: s.ID, Result: result, Error: err}) {
		return errors.New("the client does not read its answer")
	}
	return nil
}
