//lint:file-ignore SA1019 x/net's server serves one given connection (h2Server)

package egress

import (
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// HTTP/2 on inspected connections: a run that offers "h2" by ALPN is
// served by x/net/http2's server (frames, HPACK, flow control), and each
// stream's request goes through exchange, as an HTTP/1.1 request does:
// the same checkRequest (:authority held to the connection's host as Host
// is), the same normalPath, the same decision, secrets and refusals.
//
// Toward the server the gateway speaks HTTP/1.1 only, one request at a
// time per upstream connection: each request is written again by the one
// writer the gateway has (forward, with http.Request's Write), and an
// upstream connection carries requests decided in one context only, which
// a multiplexed HTTP/2 connection of streams decided at different moments
// would not. Streams in
// flight take an upstream connection each (at most h2Streams).
//
// Fail-closed choices: CONNECT, extended CONNECT included, is refused
// (405); HTTP/2 has no Upgrade (the server refuses connection-specific
// headers as malformed); a request's trailers are not forwarded: a stream
// that sends them has its request stopped and refused (403, audited), and
// trailers seen on any stream stop every request body of the connection
// that ends after them (h2Watch cannot tell which handler a stream is).
// HPACK tables, header lists, frames, streams and flow-control windows
// are bounded below so that one run's connection holds little of the
// daemon.
const (
	// h2Streams bounds a connection's streams in flight, each holding an
	// upstream connection while it is served.
	h2Streams = 16
	// h2HeaderBytes bounds a request's header list (HTTP/1.1's head is
	// bounded by the reader's 32 KiB too).
	h2HeaderBytes = 32 << 10
	// h2Table is the HPACK dynamic table each way: the protocol's default.
	h2Table = 4096
	// h2StreamWindow and h2ConnWindow bound what a run may send ahead of
	// the gateway's reading.
	h2StreamWindow = 256 << 10
	h2ConnWindow   = 1 << 20
)

// h2Server is what every inspected HTTP/2 connection is served with.
// x/net deprecates its own server's knobs and ServeConn for net/http's
// copy of the same server, which serves connections from a listener only;
// the gateway serves one connection it has terminated and watches
// (h2Watch), which ServeConn takes as it is.
var h2Server = &http2.Server{
	MaxConcurrentStreams:         h2Streams,
	MaxDecoderHeaderTableSize:    h2Table,
	MaxEncoderHeaderTableSize:    h2Table,
	MaxReadFrameSize:             16 << 10, // the protocol's minimum
	MaxUploadBufferPerConnection: h2ConnWindow,
	MaxUploadBufferPerStream:     h2StreamWindow,
	IdleTimeout:                  idleWait,
	WriteByteTimeout:             headWait,
}

// h2Base gives the server its header-list bound, and keeps its logging
// (a client's protocol errors) out of the daemon's.
var h2Base = &http.Server{MaxHeaderBytes: h2HeaderBytes, ErrorLog: log.New(io.Discard, "", 0)}

// serveH2 serves the run's HTTP/2 connection c, terminated, to fixed. It
// returns when the connection has ended and its streams are served.
func (f *flow) serveH2(c terminated, fixed target, pre <-chan *upstreamConn) {
	w := &h2Watch{terminated: c, pre: len(http2.ClientPreface)}
	pool := &h2Pool{f: f, pre: pre}
	var streams sync.WaitGroup
	h := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		streams.Add(1)
		defer streams.Done()
		f.h2Request(rw, req, fixed, w, pool)
	})
	h2Server.ServeConn(w, &http2.ServeConnOpts{Context: f.g.ctx, BaseConfig: h2Base, Handler: h})
	// Streams still served wait on their servers: their upstreams are
	// closed, so that they end now.
	pool.close()
	f.closeUpstreams()
	streams.Wait()
}

// h2Request serves one stream's request.
func (f *flow) h2Request(rw http.ResponseWriter, req *http.Request, fixed target, w *h2Watch, pool *h2Pool) {
	a := &h2Answer{w: rw}
	if req.Method == http.MethodConnect {
		a.status(http.StatusMethodNotAllowed, "CONNECT is not forwarded inside a connection")
		return
	}
	// :authority is req.Host; a Host header beside it must name the same
	// (exactly one host, as HTTP/1.1's).
	hosts := []string{req.Host}
	for _, h := range req.Header.Values("Host") {
		if h != req.Host {
			hosts = append(hosts, h)
		}
	}
	req.Header.Del("Host")
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = h2Body{req.Body, w}
	}
	up := pool.get()
	keep := f.exchange(req, hosts, &fixed, "https", &up, a)
	switch {
	case up == nil:
	case up.pending:
		up.raw.Close() // dialled ahead and not used
	case keep && !a.broken:
		pool.put(up)
	default:
		f.dropUpstream(up.raw)
	}
	if a.broken {
		// The answer could not be relayed whole: the stream is reset,
		// never ended as if it were complete.
		panic(http.ErrAbortHandler)
	}
}

// h2Answer answers on an HTTP/2 stream.
type h2Answer struct {
	w      http.ResponseWriter
	broken bool // the answer was begun and not finished
}

func (a *h2Answer) status(code int, msg string) {
	a.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	a.w.WriteHeader(code)
	_, _ = io.WriteString(a.w, msg+"\n")
}

func (a *h2Answer) answer(resp *http.Response, _ *upstreamConn) error {
	if resp.StatusCode < 200 {
		// An interim answer: the stream's own 100 Continue is sent by the
		// server as the body is read.
		return nil
	}
	h := a.w.Header()
	hop := hopHeaders(resp.Header)
	for k, vs := range resp.Header {
		if !hop[http.CanonicalHeaderKey(k)] {
			h[k] = vs
		}
	}
	a.w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(a.w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := a.w.Write(buf[:n]); werr != nil {
				a.broken = true
				return werr
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			a.broken = true
			return err
		}
	}
	for k, vs := range resp.Trailer {
		h[http.TrailerPrefix+k] = vs
	}
	return nil
}

// hopHeaders are the headers of an HTTP/1.1 answer that belong to its
// connection (RFC 9110 7.6.1), which HTTP/2 does not carry.
func hopHeaders(h http.Header) map[string]bool {
	m := map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
		"Transfer-Encoding": true, "Upgrade": true, "Te": true, "Trailer": true}
	for _, v := range h.Values("Connection") {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				m[http.CanonicalHeaderKey(n)] = true
			}
		}
	}
	return m
}

// h2Pool keeps a connection's idle upstreams for its next streams.
type h2Pool struct {
	f      *flow
	mu     sync.Mutex
	idle   []*upstreamConn
	pre    <-chan *upstreamConn // dialled ahead, for the first stream that takes it
	closed bool
}

// get is an idle upstream, or the one dialled ahead, or nil; exchange
// dials again when it was dialled for another context.
func (p *h2Pool) get() *upstreamConn {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		u := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return u
	}
	pre := p.pre
	p.pre = nil
	p.mu.Unlock()
	return takePredial(&pre)
}

func (p *h2Pool) put(u *upstreamConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < h2Streams {
		p.idle = append(p.idle, u)
		u = nil
	}
	p.mu.Unlock()
	if u != nil {
		p.f.dropUpstream(u.raw)
	}
}

func (p *h2Pool) close() {
	p.mu.Lock()
	idle, pre := p.idle, p.pre
	p.idle, p.pre, p.closed = nil, nil, true
	p.mu.Unlock()
	dropPredial(&pre)
	for _, u := range idle {
		p.f.dropUpstream(u.raw)
	}
}

// h2Watch is the run's end of an HTTP/2 connection, as the server reads
// it: it reads the frames' headers as they pass and notes a HEADERS frame
// on a stream that has had one (trailers), before the server takes it.
type h2Watch struct {
	terminated
	pre      int    // bytes of the client preface still to pass
	hdr      []byte // a frame header read in part
	skip     int    // bytes of the current frame's payload still to pass
	maxID    uint32 // the highest stream a HEADERS frame opened
	trailers atomic.Uint32
}

func (w *h2Watch) Read(p []byte) (int, error) {
	n, err := w.terminated.Read(p)
	w.scan(p[:n])
	return n, err
}

// scan follows the frames in b (what the server reads next, in order; one
// goroutine reads).
func (w *h2Watch) scan(b []byte) {
	for len(b) > 0 {
		switch {
		case w.pre > 0:
			k := min(w.pre, len(b))
			w.pre -= k
			b = b[k:]
		case w.skip > 0:
			k := min(w.skip, len(b))
			w.skip -= k
			b = b[k:]
		default:
			k := min(9-len(w.hdr), len(b))
			w.hdr = append(w.hdr, b[:k]...)
			b = b[k:]
			if len(w.hdr) < 9 {
				return
			}
			length := int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
			id := binary.BigEndian.Uint32(w.hdr[5:9]) & 0x7fffffff
			if http2.FrameType(w.hdr[3]) == http2.FrameHeaders && id != 0 {
				if id <= w.maxID {
					w.trailers.Store(id)
				} else {
					w.maxID = id
				}
			}
			w.skip, w.hdr = length, w.hdr[:0]
		}
	}
}

var _ net.Conn = (*h2Watch)(nil)

// errTrailers ends a request body after which the run sent trailers.
var errTrailers = errors.New("request trailers are not forwarded")

// h2Body is a stream's request body: its end is an error when the
// connection has carried trailers.
type h2Body struct {
	io.ReadCloser
	w *h2Watch
}

func (b h2Body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.w.trailers.Load() != 0 {
		return n, errTrailers
	}
	return n, err
}
