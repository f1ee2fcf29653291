package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clientConn is the run's end of a connection: a kernel socket (the
// kernel capture) or the stack's endpoint (netstack).
type clientConn interface {
	net.Conn
	CloseWrite() error
}

// flow is one TCP connection of the run.
type flow struct {
	g       *Gateway
	client  clientConn
	abort   func()                  // ends client with a reset
	decided atomic.Pointer[Request] // what it was last allowed as

	mu sync.Mutex
	// upstreams are f's open upstream connections and where each was
	// dialled: one, but one per HTTP/2 stream in flight (inspect_h2.go).
	upstreams map[net.Conn]netip.Addr
	addr      netip.Addr // where the last upstream was dialled
	cutDone   bool
	reset     bool // end with a reset: a refusal the program is not told of otherwise
}

// cut ends f at once: a reset to the run and to the upstream.
func (f *flow) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endLocked(true)
}

// end ends f when it is served: gracefully (what was written to the run
// reaches it, an HTTP refusal included), unless it was refused with a
// reset.
func (f *flow) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endLocked(f.reset)
}

func (f *flow) endLocked(reset bool) {
	if f.cutDone {
		return
	}
	f.cutDone = true
	if reset {
		f.abort()
	} else {
		f.client.Close()
	}
	for c := range f.upstreams {
		if tc, ok := c.(*net.TCPConn); ok && reset {
			// A reset upstream too: a graceful close would still send
			// what the relay had queued in the socket, after the cut
			// returned (TestEgressCutDropsQueuedBytes).
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}

// refuse marks f to end with a reset.
func (f *flow) refuse() {
	f.mu.Lock()
	f.reset = true
	f.mu.Unlock()
}

// setUpstream records c, dialled at addr, as an upstream of f; false (c
// closed) when f was cut.
func (f *flow) setUpstream(c net.Conn, addr netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutDone {
		c.Close()
		return false
	}
	if f.upstreams == nil {
		f.upstreams = map[net.Conn]netip.Addr{}
	}
	f.upstreams[c], f.addr = addr, addr
	return true
}

// dropUpstream closes c, an upstream of f no request uses any more.
func (f *flow) dropUpstream(c net.Conn) {
	f.mu.Lock()
	delete(f.upstreams, c)
	f.mu.Unlock()
	c.Close()
}

// closeUpstreams closes f's upstreams, ending the requests that wait on
// them.
func (f *flow) closeUpstreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.upstreams {
		c.Close()
	}
	clear(f.upstreams)
}

// dialled is the address f's last upstream was dialled at (invalid: none).
func (f *flow) dialled() netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addr
}

// dialledAll is where f's open upstreams were dialled.
func (f *flow) dialledAll() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := make([]netip.Addr, 0, len(f.upstreams))
	for _, a := range f.upstreams {
		l = append(l, a)
	}
	return l
}

func (f *flow) serve(dst netip.Addr, port int) {
	// Its size bounds a request head and a first line (32 KiB, as
	// common servers' limits).
	br := bufio.NewReaderSize(f.client, 32<<10)
	switch {
	case dst == GatewayAddr && port == ProxyPort:
		f.proxy(br)
	case dst == GatewayAddr:
		// Nothing else listens at the gateway (no DNS over TCP).
		f.refuse()
	case nameRange.Contains(dst):
		if host, ok := f.g.names.name(dst); ok {
			f.captured(br, host, port)
		} else {
			f.refuse()
		}
	default:
		f.captured(br, dst.String(), port)
	}
}

// captured serves a connection to host:port, classified by its first bytes.
func (f *flow) captured(br *bufio.Reader, host string, port int) {
	proto := sniff(f.client, br, sniffWait)
	switch proto {
	case "http":
		f.serveHTTP(br, &target{host: host, port: port})
	case "https":
		f.https(br, host, port)
	case "tcp":
		f.tunnel(br, Request{Host: host, Port: port, Protocol: "tcp"})
	case "silent":
		f.silent(br, host, port)
	default:
		f.refuse()
		f.g.audit(Event{Request: Request{Host: host, Port: port, Protocol: "tcp"},
			Verdict: Verdict{Decision: "deny", Reasons: []string{"the connection's first bytes could not be classified in time"}}})
	}
}

// sniff classifies a connection by its first bytes without taking them:
// "https" for a TLS handshake record; "http" for a first line any lenient
// server could read as a request line (requestLine); "tcp" for anything
// else; "silent" when nothing comes within wait (0: no limit); "" when the
// first line neither ends nor turns binary within headWait and the reader's
// size (refused: a program must not get "tcp" by pausing or by length).
func sniff(c net.Conn, br *bufio.Reader, wait time.Duration) string {
	if wait > 0 {
		_ = c.SetReadDeadline(time.Now().Add(wait))
	}
	b, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || len(b) == 0 {
		if wait > 0 && isTimeout(err) {
			return "silent"
		}
		return "tcp"
	}
	if b[0] == 0x16 {
		return "https"
	}
	_ = c.SetReadDeadline(time.Now().Add(headWait))
	defer c.SetReadDeadline(time.Time{})
	for {
		buf, _ := br.Peek(br.Buffered())
		if v, done := requestLine(buf, false); done {
			return v
		}
		if br.Buffered() == br.Size() {
			return ""
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			if isTimeout(err) {
				return ""
			}
			// The program's end: a server reads what came as a line.
			buf, _ = br.Peek(br.Buffered())
			v, _ := requestLine(buf, true)
			return v
		}
	}
}

// requestLine classifies the first line of buf; done is false while more is
// needed. Blanks are every byte some server splits a request line on
// (Python's str.split on Latin-1 text among them); a control byte that is
// not one makes it "tcp" at once. A line (after leading blanks, so blank
// lines too) of two fields or more whose last one starts with "HTTP/", or
// whose second is a request target (starting with "/" or "*", holding
// "://", or after CONNECT), is "http": Go's parser then answers 400 for
// what is not HTTP exactly.
func requestLine(buf []byte, atEnd bool) (string, bool) {
	i := 0
	for i < len(buf) && isBlank(buf[i]) {
		i++
	}
	end := -1
	sawBlank := false
	for j := i; j < len(buf); j++ {
		if buf[j] == '\n' {
			end = j
			break
		}
		if isBlank(buf[j]) {
			sawBlank = true
		} else if !sawBlank && (buf[j] < 0x20 || buf[j] == 0x7f) {
			// A control byte in the first field: no method token.
			return "tcp", true
		}
	}
	if end < 0 {
		if !atEnd {
			return "", false
		}
		end = len(buf)
	}
	// Split byte by byte: a lone 0x85 or 0xa0 is not UTF-8, but Latin-1
	// white space to Python.
	var fields []string
	start := -1
	for j := i; j <= end; j++ {
		if j == end || isBlank(buf[j]) {
			if start >= 0 {
				fields = append(fields, string(buf[start:j]))
				start = -1
			}
		} else if start < 0 {
			start = j
		}
	}
	if len(fields) >= 2 {
		last, second := fields[len(fields)-1], fields[1]
		if len(last) >= 5 && strings.EqualFold(last[:5], "HTTP/") ||
			strings.HasPrefix(second, "/") || strings.HasPrefix(second, "*") || strings.Contains(second, "://") ||
			knownMethod(fields[0]) {
			return "http", true
		}
	}
	return "tcp", true
}

// knownMethod: a method of the IANA registry (any case): a line that starts
// with one is HTTP to some server whatever its target (HTTP/0.9's "GET x").
func knownMethod(m string) bool {
	switch strings.ToUpper(m) {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
		"ACL", "BASELINE-CONTROL", "BIND", "CHECKIN", "CHECKOUT", "COPY", "LABEL", "LINK", "LOCK",
		"MERGE", "MKACTIVITY", "MKCALENDAR", "MKCOL", "MKREDIRECTREF", "MKWORKSPACE", "MOVE",
		"ORDERPATCH", "PRI", "PROPFIND", "PROPPATCH", "QUERY", "REBIND", "REPORT", "SEARCH",
		"UNBIND", "UNCHECKOUT", "UNLINK", "UNLOCK", "UPDATE", "UPDATEREDIRECTREF", "VERSION-CONTROL",
		"M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE":
		return true
	}
	return false
}

// isBlank: what some server takes as white space in a request line.
func isBlank(c byte) bool {
	return c == ' ' || c >= '\t' && c <= '\r' || c >= 0x1c && c <= 0x1f || c == 0x85 || c == 0xa0
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tunnelTLS serves a TLS connection to host:port: the SNI must name host,
// in the client hello and in the second one a server may ask for.
func (f *flow) tunnelTLS(br *bufio.Reader, host string, port int) {
	r := Request{Host: host, Port: port, Protocol: "https"}
	refuse := func(why string) {
		f.refuse()
		f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "deny", Reasons: []string{why}}})
	}
	sni, head, err := clientHello(f.client, br)
	switch {
	case err != nil:
		refuse("no TLS client hello could be read: " + err.Error())
		return
	case sni == "" || canonicalHost(sni) != host:
		refuse("the client hello names " + strconv.Quote(sni) + ", not " + strconv.Quote(host))
		return
	}
	src := bufio.NewReader(io.MultiReader(bytes.NewReader(head), br))
	hello, err := handshakeRecords(src)
	if err == nil {
		err = oneHostName(hello)
	}
	if err != nil {
		refuse("the client hello's records: " + err.Error())
		return
	}
	f.tunnelWith(src, r, &helloGuard{f: f, r: r, hello: hello, src: src})
}

// tunnel decides r and, allowed, relays the connection's bytes both ways
// (from src, which holds what was read already). A denial resets the run's
// end.
func (f *flow) tunnel(src io.Reader, r Request) { f.tunnelWith(src, r, nil) }

// tunnelWith is tunnel; a TLS connection's relay begins under hg.
func (f *flow) tunnelWith(src io.Reader, r Request, hg *helloGuard) {
	v, _ := f.g.decideFor(f, r)
	if !v.Allowed() {
		f.g.audit(Event{Request: r, Verdict: v})
		f.refuse()
		return
	}
	up, addr, why := f.g.dial(r.Host, r.Port)
	f.g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: why})
	if up == nil {
		f.refuse()
		return
	}
	if !f.g.adopt(f, r, v, up, addr) {
		return
	}
	if hg == nil {
		relay(f.client, src, up, up, func() bool { return true }, nil)
		return
	}
	hg.up, hg.verdict, hg.retry = up, v, make(chan error, 1)
	upBr := bufio.NewReaderSize(up, maxRecord)
	relay(f.client, src, up, upBr, hg.client, func() { hg.retry <- serverRetries(upBr) })
}

// silent serves a connection whose program said nothing within sniffWait:
// a preconnect, or a protocol whose server speaks first. When tcp to
// host:port is allowed it is dialled, and the side that speaks first
// decides: the server (relayed as tcp; the program's first bytes are then
// refused if they are HTTP or TLS, which would have been decided as such:
// waiting must not turn a request into opaque bytes), or the program (its
// bytes classified as on any connection; the upstream dialled for tcp is
// dropped unless they are tcp). Otherwise nothing is dialled until the
// program speaks.
func (f *flow) silent(br *bufio.Reader, host string, port int) {
	r := Request{Host: host, Port: port, Protocol: "tcp"}
	if !f.g.wouldAllow(r) {
		switch sniff(f.client, br, idleWait) {
		case "http":
			f.serveHTTP(br, &target{host: host, port: port})
		case "https":
			f.https(br, host, port)
		case "tcp":
			f.tunnel(br, r) // decided, and refused
		default:
			f.refuse()
		}
		return
	}
	v, _ := f.g.decideFor(f, r)
	if !v.Allowed() {
		f.g.audit(Event{Request: r, Verdict: v})
		f.refuse()
		return
	}
	up, addr, why := f.g.dial(host, port)
	f.g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: why})
	if up == nil {
		f.refuse()
		return
	}
	if !f.g.adopt(f, r, v, up, addr) {
		return
	}
	upBr := bufio.NewReaderSize(up, 32<<10)
	clientFirst, serverFirst := make(chan error, 1), make(chan error, 1)
	go func() { _, err := br.Peek(1); clientFirst <- err }()
	go func() { _, err := upBr.Peek(1); serverFirst <- err }()
	select {
	case err := <-clientFirst:
		if err != nil {
			return
		}
		switch sniff(f.client, br, 0) {
		case "tcp":
			relay(f.client, br, up, upBr, func() bool { return true }, func() { <-serverFirst })
		case "http":
			up.Close()
			f.serveHTTP(br, &target{host: host, port: port})
		case "https":
			up.Close()
			f.https(br, host, port)
		default:
			f.refuse()
		}
	case err := <-serverFirst:
		if err != nil {
			return
		}
		relay(f.client, br, up, upBr, func() bool {
			if err := <-clientFirst; err != nil {
				return false
			}
			why := "cut: the program sent HTTP or TLS after its server spoke first"
			switch sniff(f.client, br, 0) {
			case "tcp":
				return true
			case "":
				why = "cut: the program's first line after its server spoke could not be classified in time"
			}
			f.g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: why})
			f.cut()
			return false
		}, nil)
	}
}

// dial connects to host:port for an allowed request: resolved by the
// daemon, never to a refused address. It returns the connection and the
// address, or nil and why not.
func (g *Gateway) dial(host string, port int) (net.Conn, netip.Addr, string) {
	ctx, cancel := context.WithTimeout(g.ctx, dialWait)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		// Rooted: the host's search domains must not turn an allowed
		// name into one of its own networks' names.
		addrs, err = g.cfg.Resolve(ctx, host+".")
		if err != nil || len(addrs) == 0 {
			return nil, netip.Addr{}, "the name does not resolve"
		}
	}
	why := ""
	var d net.Dialer
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if p := g.private(a); p != "" && (g.cfg.Reach == nil || !g.cfg.Reach(a)) {
			why = strings.TrimSpace(host + " resolves to " + a.String() + ", " + p + ", which reach_private does not list")
			continue
		}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err != nil {
			why = "cannot connect to " + a.String() + ": " + err.Error()
			continue
		}
		return c, a, ""
	}
	if len(addrs) > 0 && why != "" {
		return nil, addrs[0].Unmap(), why
	}
	return nil, netip.Addr{}, why
}

// relay copies both ways until both directions end; each end's close is
// passed on as a half close. Nothing of the program's (src) goes upstream
// unless clientGate allows it; nothing of upstream's (upSrc) is read before
// upGate, when set, returns.
func relay(client clientConn, src io.Reader, up net.Conn, upSrc io.Reader, clientGate func() bool, upGate func()) {
	done := make(chan struct{}, 2)
	go func() {
		if clientGate() {
			_, _ = io.Copy(up, src)
		}
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		if upGate != nil {
			upGate()
		}
		_, _ = io.Copy(client, upSrc)
		_ = client.CloseWrite()
		done <- struct{}{}
	}()
	<-done
	<-done
}

// recorder keeps what is read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// readOnly is a net.Conn that reads from r and drops what is written (the
// alert crypto/tls sends when it is stopped).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnly) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnly) Close() error                     { return nil }
func (readOnly) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnly) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnly) SetDeadline(time.Time) error      { return nil }
func (readOnly) SetReadDeadline(time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(time.Time) error { return nil }
