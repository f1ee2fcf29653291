package egress

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"sync"
)

// How an answer is relayed to the run's HTTP/1.1 connection (h1Answer).
// The body passes through net/http's Response.Write, framed as the
// server's answer is read (by Content-Length, or chunked again); what is
// beneath it decides only how many system calls and TLS records carry
// it. The server's TLS is read through a large buffer (readAhead: one read
// of the socket for many records), the answer is gathered while what the
// server sent is at hand (runWriter), and it goes to the run's socket in
// one write whatever number of TLS records it makes (batchConn). Nothing
// is held once the gateway would wait for the server: what is gathered is
// written first, so an answer the server streams reaches the run as it is
// sent.

// answerBuf is how much of an answer is gathered before it is written.
const answerBuf = 128 << 10

// readAheadSize is how much of the server's TLS one read of its socket
// takes.
const readAheadSize = 128 << 10

// batchBuf holds what TLS makes of answerBuf: a record's overhead is 22
// bytes at most in TLS 1.3 (header, content type, tag), 29 in 1.2.
const batchBuf = answerBuf + (answerBuf/(16<<10)+1)*29

var (
	answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, answerBuf); return &b }}
	batchBufs  = sync.Pool{New: func() any { b := make([]byte, 0, batchBuf); return &b }}
)

// readAhead is the socket to a server, read in large reads; the TLS client
// over it takes its records from what one read got. Its buffer is taken
// from a pool when a read needs one and given back once drained: an idle
// connection holds none. It follows the records' boundaries in what it
// passes on (record).
type readAhead struct {
	net.Conn
	buf  *[]byte
	r, w int
	err  error // after what is buffered
	// The record being passed on: its header's bytes so far, or what is
	// left of its body.
	hdr  [5]byte
	nh   int
	left int
}

var readAheadBufs = sync.Pool{New: func() any { b := make([]byte, readAheadSize); return &b }}

func newReadAhead(c net.Conn) *readAhead { return &readAhead{Conn: c} }

func (c *readAhead) Read(p []byte) (int, error) {
	if c.r == c.w {
		if c.err != nil {
			err := c.err
			c.err = nil
			return 0, err
		}
		if len(p) >= readAheadSize {
			n, err := c.Conn.Read(p)
			c.track(p[:n])
			return n, err
		}
		if c.buf == nil {
			c.buf = readAheadBufs.Get().(*[]byte)
		}
		n, err := c.Conn.Read(*c.buf)
		c.r, c.w, c.err = 0, n, err
		if n == 0 {
			c.drained()
			c.err = nil
			return 0, err
		}
	}
	n := copy(p, (*c.buf)[c.r:c.w])
	c.track(p[:n])
	c.r += n
	if c.r == c.w {
		c.drained()
	}
	return n, nil
}

func (c *readAhead) drained() {
	if c.buf != nil {
		readAheadBufs.Put(c.buf)
		c.buf = nil
	}
	c.r, c.w = 0, 0
}

// track follows the records' boundaries through b, passed on.
func (c *readAhead) track(b []byte) {
	for len(b) > 0 {
		if c.left > 0 {
			k := min(c.left, len(b))
			c.left -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.nh:], b)
		c.nh += k
		b = b[k:]
		if c.nh == len(c.hdr) {
			c.left = int(binary.BigEndian.Uint16(c.hdr[3:5]))
			c.nh = 0
		}
	}
}

// record reports whether the TLS client can finish a record with what is
// buffered: the rest of the one it has begun, or a whole next one. One it
// was passed whole and has not read yet is not seen: false then only
// means an answer is written a little earlier.
func (c *readAhead) record() bool {
	var b []byte
	if c.buf != nil {
		b = (*c.buf)[c.r:c.w]
	}
	if c.left > 0 {
		return len(b) >= c.left
	}
	var h [5]byte
	copy(h[:], c.hdr[:c.nh])
	if len(b) < len(h)-c.nh {
		return false
	}
	copy(h[c.nh:], b)
	return len(b) >= len(h)-c.nh+int(binary.BigEndian.Uint16(h[3:5]))
}

// ready reports whether the next read of up's answer is served from what
// the gateway has already read: its own buffer, or a whole TLS record.
// Conservative: TLS's own buffer cannot be seen, and false only means the
// gathered answer is written earlier.
func (up *upstreamConn) ready() bool {
	if up.br.Buffered() > 0 {
		return true
	}
	tc, ok := up.c.(*tls.Conn)
	if !ok {
		return false
	}
	ra, ok := tc.NetConn().(*readAhead)
	return ok && ra.record()
}

// batchConn is the socket beneath the TLS server toward the run: what TLS
// writes while a batch is open goes out in one write when it closes.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf []byte
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// writeThrough writes p through tc, which writes to c, as one write to the
// socket. What TLS writes beside it meanwhile (an alert) keeps its place.
func (c *batchConn) writeThrough(tc *tls.Conn, p []byte) (int, error) {
	c.mu.Lock()
	c.on = true
	if c.buf == nil {
		c.buf = (*batchBufs.Get().(*[]byte))[:0]
	}
	c.mu.Unlock()
	n, err := tc.Write(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	if len(c.buf) > 0 {
		if _, werr := c.Conn.Write(c.buf); err == nil {
			err = werr
		}
	}
	if cap(c.buf) == batchBuf {
		b := c.buf[:0]
		batchBufs.Put(&b)
	}
	c.buf = nil
	if err != nil {
		n = 0
	}
	return n, err
}

// runWriter is what Response.Write writes an answer to: the head and the
// body's framing gathered, the body read into the same buffer while the
// server's bytes are at hand, all written once the next read would wait
// (or the buffer is full).
type runWriter struct {
	c        clientConn
	up       *upstreamConn
	pend     []byte
	pool     *[]byte
	reading  bool // in ReadFrom: the body reads into pend
	flushErr error
}

func newRunWriter(c clientConn, up *upstreamConn) *runWriter {
	p := answerBufs.Get().(*[]byte)
	return &runWriter{c: c, up: up, pend: (*p)[:0], pool: p}
}

// free gives the buffer back; w is not used after.
func (w *runWriter) free() {
	*w.pool = w.pend[:0]
	answerBufs.Put(w.pool)
	w.pend = nil
}

func (w *runWriter) Write(p []byte) (int, error) {
	if w.flushErr != nil {
		return 0, w.flushErr
	}
	if len(w.pend)+len(p) > cap(w.pend) {
		if err := w.flush(); err != nil {
			return 0, err
		}
		if len(p) > cap(w.pend) {
			return w.send(p)
		}
	}
	w.pend = append(w.pend, p...)
	return len(p), nil
}

// ReadFrom reads a body (Content-Length or to the end) into the buffer
// itself.
func (w *runWriter) ReadFrom(r io.Reader) (int64, error) {
	w.reading = true
	defer func() { w.reading = false }()
	var n int64
	for {
		if len(w.pend) == cap(w.pend) || (len(w.pend) > 0 && !w.up.ready()) {
			if err := w.flush(); err != nil {
				return n, err
			}
		}
		m, err := r.Read(w.pend[len(w.pend):cap(w.pend)])
		w.pend = w.pend[:len(w.pend)+m]
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// flush writes what is gathered.
func (w *runWriter) flush() error {
	if w.flushErr != nil {
		return w.flushErr
	}
	if len(w.pend) == 0 {
		return nil
	}
	_, err := w.send(w.pend)
	w.pend = w.pend[:0]
	w.flushErr = err
	return err
}

func (w *runWriter) send(p []byte) (int, error) {
	if t, ok := w.c.(terminated); ok && t.batch != nil {
		return t.batch.writeThrough(t.Conn, p)
	}
	return w.c.Write(p)
}

// waitBody is an answer's body that writes what is gathered before a read
// that would wait for the server (a chunked body is framed through Write).
type waitBody struct {
	io.ReadCloser
	w *runWriter
}

func (b waitBody) Read(p []byte) (int, error) {
	if !b.w.reading && !b.w.up.ready() {
		if err := b.w.flush(); err != nil {
			return 0, err
		}
	}
	return b.ReadCloser.Read(p)
}

type h1Answer struct{ f *flow }

func (a h1Answer) status(code int, msg string) { a.f.status(code, msg) }

func (a h1Answer) answer(resp *http.Response, up *upstreamConn) error {
	w := newRunWriter(a.f.client, up)
	defer w.free()
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = waitBody{resp.Body, w}
	}
	err := resp.Write(w)
	if err == nil {
		err = w.flush()
	}
	return err
}
