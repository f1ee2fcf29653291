// Package control is the daemon's control socket: JSON-RPC 2.0 over a Unix
// stream socket, one JSON object per line each way. It knows framing,
// errors and access (SO_PEERCRED); what the methods do is the Handler's.
//
// Requests on one connection are answered in order; connections are served
// concurrently, each by its own goroutine, so a slow or stalled client
// holds up only itself and is cut off by its deadlines. A connection's
// peer is checked in the accept loop, before it takes a slot; root and the
// daemon's uid always have slots kept for them, and every other uid has a
// cap of its own (slots.go).
package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/internal/jsonwire"
	"golang.org/x/sys/unix"
)

// JSON-RPC error codes.
const (
	CodeParse          = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603
	// Application errors: -32000 to -32099.
	CodeUnknownSession = -32001
	CodeSessionExists  = -32002
	CodeMount          = -32003
	CodeConfig         = -32004
	CodeRefused        = -32010
	// CodeNotOwner: the session belongs to another uid.
	CodeNotOwner = -32011
	// CodeForbidden: the peer may not do this (a mountpoint it may not
	// use, an owner it may not name).
	CodeForbidden = -32012
	// CodeBusy: the connection limit is reached.
	CodeBusy = -32013
	// CodeRunDenied: a run the policy denies, or a command the run may
	// not execute (condfs run exits 126); CodeRunNotFound: a command that
	// exists nowhere (127). Every other error of run exits 125.
	CodeRunDenied   = -32020
	CodeRunNotFound = -32021
	// CodeUncommitted: a staged session with uncommitted changes was
	// asked to close; CodeUnknownCheckpoint: no such checkpoint in the
	// session; CodeNotStaged: commit or discard of a session that is not
	// staged (docs/changes.md).
	CodeUncommitted       = -32030
	CodeUnknownCheckpoint = -32031
	CodeNotStaged         = -32032
)

type peerKey struct{}

// PeerUID is the uid of the socket peer a request came from (SO_PEERCRED).
func PeerUID(ctx context.Context) (uint32, bool) {
	uid, ok := ctx.Value(peerKey{}).(uint32)
	return uid, ok
}

// WithPeerUID is how the server tells handlers who is asking; tests of
// handlers use it too.
func WithPeerUID(ctx context.Context, uid uint32) context.Context {
	return context.WithValue(ctx, peerKey{}, uid)
}

// MaxLine is the longest request line accepted (not counting the newline).
const MaxLine = 1 << 20

// Error is a JSON-RPC error object.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (code %d)", e.Message, e.Code) }

// Errorf makes an error with a code.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// DecodeParams decodes a method's params into v; a field v does not have
// is an error, as is anything else that does not decode.
func DecodeParams(raw json.RawMessage, v any) *Error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeInvalidParams, "invalid params: %v", err)
	}
	return nil
}

// Handler answers one method call. It returns a result to marshal, or an
// error.
type Handler func(ctx context.Context, method string, params json.RawMessage) (any, *Error)

// Options configure a Server.
type Options struct {
	Path      string
	Mode      os.FileMode // socket file mode; 0 means 0600
	Group     int         // socket file group; -1 leaves it
	AllowUIDs []uint32    // besides the daemon's uid and root
	Handler   Handler
	Logger    *slog.Logger
	// IdleTimeout cuts a connection that sends nothing (or half a line)
	// for this long; WriteTimeout cuts one that does not read its answers.
	IdleTimeout  time.Duration
	WriteTimeout time.Duration
	// MaxConns bounds the connections served at once (default 1024); one
	// more gets an error line and is closed. An eighth of them (at least
	// one) only root and the daemon's uid may take; MaxConnsPerUID
	// (default an eighth, at least one) bounds each other uid. See
	// slots.go.
	MaxConns       int
	MaxConnsPerUID int
	// IdleGrace: while connections are short, one of a uid other than
	// root and the daemon's that has been idle this long may be closed
	// (default 10s).
	IdleGrace time.Duration
	// OnConn, if set, is told of each connection admitted; OnError of the
	// code of each error answered (metrics).
	OnConn  func()
	OnError func(code int)
}

// Server serves the control socket.
type Server struct {
	opts  Options
	self  uint32 // the daemon's uid
	ln    *net.UnixListener
	wg    sync.WaitGroup
	mu    sync.Mutex
	slots slotTable // guarded by mu
	// peerUID reads a connection's uid: peerCred, or a stand-in in
	// tests that play several uids from one process.
	peerUID func(*net.UnixConn) (uint32, error)
	// refusals: when each uid's refused connection was last logged, and
	// how many since were not.
	logMu    sync.Mutex
	refusals map[uint32]refusalLog
	done     chan struct{}
	once     sync.Once
	// panics counts handlers that panicked.
	panics atomic.Int64
	// Each uid's closers of the descriptors its peers sent (stream.go).
	closeMu sync.Mutex
	closeQ  map[uint32]chan int
	closers sync.WaitGroup
}

// Live reports an error if a daemon answers on path: a second daemon must
// not start (nor touch the first one's mounts and state).
func Live(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("socket %s: a live daemon is already serving it; stop it or pick another --socket", path)
}

// Listen creates the socket. A socket file left by a crashed daemon is
// replaced; a live daemon on the same path is detected and refused.
func Listen(opts Options) (*Server, error) {
	if opts.Mode == 0 {
		opts.Mode = 0o600
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = 10 * time.Minute
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 1024
	}
	if opts.MaxConnsPerUID <= 0 {
		opts.MaxConnsPerUID = defaultPerUID(opts.MaxConns)
	}
	if opts.IdleGrace <= 0 {
		opts.IdleGrace = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := prepareDir(filepath.Dir(opts.Path)); err != nil {
		return nil, err
	}
	if err := Live(opts.Path); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(opts.Path); err == nil {
		if err := os.Remove(opts.Path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", opts.Path, err)
		}
	}
	// Create the socket with no access for anyone but us, then widen it
	// if asked: there is no window in which others may connect.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: opts.Path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", opts.Path, err)
	}
	ln.SetUnlinkOnClose(true)
	if opts.Group >= 0 {
		if err := os.Chown(opts.Path, -1, opts.Group); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(opts.Path, opts.Mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	s := &Server{
		opts: opts, self: uint32(os.Geteuid()), ln: ln, done: make(chan struct{}), peerUID: peerCred,
		slots:    newSlotTable(opts.MaxConns, opts.MaxConnsPerUID, opts.IdleGrace),
		refusals: map[uint32]refusalLog{},
	}
	s.wg.Add(1)
	go s.reapLoop()
	return s, nil
}

// prepareDir makes sure the socket's directory exists and is the daemon's:
// owned by it (or root) and writable by no one else.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if (st.Uid != uint32(os.Geteuid()) && st.Uid != 0) || st.Mode&0o022 != 0 {
		return fmt.Errorf("socket directory %s must be owned by the daemon's user and writable by no one else (mode %o, owner %d)", dir, st.Mode&0o777, st.Uid)
	}
	return nil
}

// Addr is the socket path.
func (s *Server) Addr() string { return s.opts.Path }

// Serve accepts connections until Close.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.opts.Logger.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.admit(c)
	}
}

// Close stops accepting, closes every connection, waits for their
// goroutines and removes the socket file.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
		s.mu.Lock()
		for sl := range s.slots.all {
			sl.c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		s.stopClosers()
	})
	return err
}

// peerCred reads the peer's uid from SO_PEERCRED.
func peerCred(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return cred.Uid, nil
}

type request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// write sends one answer; false when the client does not take it.
func (s *Server) write(c *net.UnixConn, w *bufio.Writer, resp response) bool {
	resp.JSONRPC = "2.0"
	if resp.ID == nil {
		resp.ID = json.RawMessage("null")
	}
	if resp.Error == nil && resp.Result == nil {
		resp.Result = struct{}{}
	}
	if resp.Error != nil {
		s.onError(resp.Error.Code)
	}
	b, err := json.Marshal(resp)
	if err != nil {
		b, _ = json.Marshal(response{JSONRPC: "2.0", ID: resp.ID, Error: Errorf(CodeInternal, "cannot encode the result: %v", err)})
	}
	c.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
	w.Write(b)
	w.WriteByte('\n')
	return w.Flush() == nil
}

func (s *Server) serveConn(sl *slot) {
	c := sl.c
	defer c.Close()
	w := bufio.NewWriter(c)
	fc := newFDConn(c, s, sl.uid)
	defer fc.drop()
	r := bufio.NewReaderSize(fc, 64<<10)
	ctx, cancel := context.WithCancel(context.WithValue(WithPeerUID(context.Background(), sl.uid), filesKey{}, fc))
	defer cancel()
	for {
		c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		line, tooLong, err := ReadLine(r, MaxLine, false)
		if tooLong {
			s.write(c, w, response{Error: Errorf(CodeInvalidRequest, "request line over %d bytes; closing the connection", MaxLine)})
			return
		}
		if err != nil && (err != io.EOF || len(line) == 0) {
			// A deadline or a broken connection: a half line is never
			// taken for a request.
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			if err != nil {
				return
			}
			continue
		}
		if !s.begin(sl) {
			return // closed early: a request that came too late is not served
		}
		resp, reply := s.handle(ctx, line)
		if t, ok := resp.Result.(Takeover); ok {
			fc.drop()
			c.SetReadDeadline(time.Time{})
			t(ctx, &Stream{Conn: c, R: r, ID: resp.ID, w: w, srv: s, notify: !reply})
			s.end(sl, time.Now())
			return
		}
		fc.drop()
		// Idle from when the answer goes out, not from when the write
		// returned: the order of idleness is the order clients saw.
		answered := time.Now()
		sent := !reply || s.write(c, w, resp)
		s.end(sl, answered)
		if !sent {
			return
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) handle(ctx context.Context, line []byte) (response, bool) {
	var req request
	// Parsed strictly first (internal/jsonwire, shared with the MCP
	// gateway): encoding/json keeps the last of two duplicate keys and
	// folds case ("method" and "Method", or "paramſ" onto "params"), so a
	// request a log or a proxy read one way would run another.
	if err := jsonwire.Check(line, jsonwire.Rules{}); err != nil {
		if errors.Is(err, jsonwire.ErrDuplicateKey) {
			return response{Error: Errorf(CodeInvalidRequest, "invalid request: %v", err)}, true
		}
		return response{Error: Errorf(CodeParse, "parse error: %v", err)}, true
	}
	if err := json.Unmarshal(line, &req); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) || (len(line) > 0 && line[0] != '{' && json.Valid(line)) {
			return response{Error: Errorf(CodeInvalidRequest, "a request must be a JSON object with jsonrpc, id, method and params")}, true
		}
		return response{Error: Errorf(CodeParse, "parse error: %v", err)}, true
	}
	if req.JSONRPC != "2.0" || req.Method == nil || *req.Method == "" {
		return response{ID: validID(req.ID), Error: Errorf(CodeInvalidRequest, `invalid request: need "jsonrpc":"2.0" and a "method"`)}, true
	}
	if req.ID != nil && validID(req.ID) == nil {
		return response{Error: Errorf(CodeInvalidRequest, "invalid request: id must be a string, number or null")}, true
	}
	params := req.Params
	if len(params) == 0 || string(params) == "null" {
		params = json.RawMessage("{}")
	}
	result, rerr := s.call(ctx, *req.Method, params)
	if req.ID == nil {
		if t, ok := result.(Takeover); ok {
			// A takeover runs all the same (a run's lifeline, its
			// timeout, its end), and answers nothing.
			return response{Result: t}, false
		}
		return response{}, false // a notification: no answer
	}
	if rerr != nil {
		return response{ID: req.ID, Error: rerr}, true
	}
	return response{ID: req.ID, Result: result}, true
}

// call runs the handler; a panic fails this request alone with -32603,
// logged with its stack and counted (Panics).
func (s *Server) call(ctx context.Context, method string, params json.RawMessage) (result any, rerr *Error) {
	defer func() {
		if r := recover(); r != nil {
			s.panics.Add(1)
			s.opts.Logger.Error("recovered a panic in a control method; it failed with -32603", "method", method, "panic", r, "stack", string(debug.Stack()))
			result, rerr = nil, Errorf(CodeInternal, "internal error in %s: the request failed and changed nothing it could not finish; the daemon's log has the details", method)
		}
	}()
	return s.opts.Handler(ctx, method, params)
}

func (s *Server) onError(code int) {
	if s.opts.OnError != nil {
		s.opts.OnError(code)
	}
}

// Panics counts the requests whose handler panicked.
func (s *Server) Panics() int64 { return s.panics.Load() }

func validID(id json.RawMessage) json.RawMessage {
	if id == nil {
		return nil
	}
	switch id[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'n':
		return id
	}
	return nil
}

// SocketGroup resolves --socket-group (a name or a number); "" is -1.
func SocketGroup(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	var gid int
	if _, err := fmt.Sscan(name, &gid); err == nil {
		return gid, nil
	}
	g, err := lookupGroup(name)
	if err != nil {
		return -1, fmt.Errorf("--socket-group %s: %w", name, err)
	}
	return g, nil
}

// ReadLine reads one line without its end ("\n", or "\r\n"). A line over max
// bytes (its end not counted) is reported as tooLong and never kept whole.
// With drain, the rest of a long line is read and dropped, so that the next
// call starts at the next line; without it the reader is left mid-line (a
// server then closes the connection rather than read on).
//
// err is the reader's error after the line: a last line with no newline
// comes with io.EOF (or a deadline's error), and nothing read at all is
// (nil, false, err).
func ReadLine(r *bufio.Reader, max int, drain bool) (line []byte, tooLong bool, err error) {
	for {
		chunk, rerr := r.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			// While the line goes on, allow one byte more: a '\r' whose
			// '\n' is in the next chunk.
			if len(line) > max+1 && (rerr == bufio.ErrBufferFull || len(trimEnd(line)) > max) {
				tooLong, line = true, nil
				if !drain {
					return nil, true, nil
				}
			}
		}
		if rerr == bufio.ErrBufferFull {
			continue
		}
		if tooLong {
			return nil, true, rerr
		}
		if t := trimEnd(line); len(t) > max {
			return nil, true, rerr
		}
		if rerr != nil && len(line) == 0 {
			return nil, false, rerr
		}
		return trimEnd(line), false, rerr
	}
}

func trimEnd(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}
