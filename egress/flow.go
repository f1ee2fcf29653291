package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

// flow is one TCP connection of the run.
type flow struct {
	g       *Gateway
	ep      tcpip.Endpoint
	client  *gonet.TCPConn
	decided atomic.Pointer[Request] // what it was last allowed as

	mu       sync.Mutex
	upstream net.Conn
	cutDone  bool
	reset    bool // end with a reset: a refusal the program is not told of otherwise
}

// cut ends f at once: a reset to the run, the upstream closed.
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
		f.ep.Abort()
	} else {
		f.client.Close()
	}
	if f.upstream != nil {
		f.upstream.Close()
	}
}

// refuse marks f to end with a reset.
func (f *flow) refuse() {
	f.mu.Lock()
	f.reset = true
	f.mu.Unlock()
}

// setUpstream records c as f's upstream; false (c closed) when f was cut.
func (f *flow) setUpstream(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutDone {
		c.Close()
		return false
	}
	if f.upstream != nil && f.upstream != c {
		f.upstream.Close()
	}
	f.upstream = c
	return true
}

func (f *flow) serve(dst netip.Addr, port int) {
	br := bufio.NewReaderSize(f.client, 64<<10)
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
	proto := sniff(f.client, br)
	switch proto {
	case "http":
		f.serveHTTP(br, &target{host: host, port: port})
	case "https":
		f.tunnelTLS(br, host, port)
	default:
		f.tunnel(br, Request{Host: host, Port: port, Protocol: "tcp"})
	}
}

// sniff classifies a connection by its first bytes without taking them:
// "https" for a TLS handshake record, "http" for what starts like a request
// (a token and a space; leading blank lines too, which parse as nothing
// and get 400), "tcp" for anything else or nothing within sniffWait.
func sniff(c net.Conn, br *bufio.Reader) string {
	_ = c.SetReadDeadline(time.Now().Add(sniffWait))
	b, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || len(b) == 0 {
		return "tcp"
	}
	if b[0] == 0x16 {
		return "https"
	}
	_ = c.SetReadDeadline(time.Now().Add(headWait))
	defer c.SetReadDeadline(time.Time{})
	for n := 1; n <= 24; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return "tcp"
		}
		ch := b[n-1]
		switch {
		case ch == '\r' || ch == '\n':
			if strings.Trim(string(b), "\r\n") == "" {
				continue
			}
			return "tcp"
		case ch == ' ':
			if strings.Trim(string(b), "\r\n ") == "" {
				return "tcp"
			}
			return "http"
		case ch >= 'A' && ch <= 'Z' || ch >= 'a' && ch <= 'z' || ch == '-' || ch == '_':
		default:
			return "tcp"
		}
	}
	return "tcp"
}

// errAbortHello stops crypto/tls once it has parsed the client hello.
var errAbortHello = errors.New("hello read")

// clientHello reads a TLS client hello from br, through crypto/tls's own
// parser, and returns its SNI and the bytes read, to be replayed upstream.
func clientHello(c net.Conn, br *bufio.Reader) (sni string, read []byte, err error) {
	rec := &recorder{r: br}
	var hello *tls.ClientHelloInfo
	_ = c.SetReadDeadline(time.Now().Add(headWait))
	err = tls.Server(readOnly{rec}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = h
		return nil, errAbortHello
	}}).Handshake()
	_ = c.SetReadDeadline(time.Time{})
	if hello == nil {
		if err == nil {
			err = errors.New("no client hello")
		}
		return "", nil, err
	}
	return hello.ServerName, rec.buf.Bytes(), nil
}

// tunnelTLS serves a TLS connection to host:port: the SNI must name host.
func (f *flow) tunnelTLS(br *bufio.Reader, host string, port int) {
	r := Request{Host: host, Port: port, Protocol: "https"}
	sni, head, err := clientHello(f.client, br)
	switch {
	case err != nil:
		f.refuse()
		f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "deny", Reasons: []string{"no TLS client hello could be read: " + err.Error()}}})
		return
	case sni == "" || canonicalHost(sni) != host:
		f.refuse()
		f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "deny",
			Reasons: []string{"the client hello names " + strconv.Quote(sni) + ", not " + strconv.Quote(host)}}})
		return
	}
	f.tunnel(io.MultiReader(bytes.NewReader(head), br), r)
}

// tunnel decides r and, allowed, relays the connection's bytes both ways
// (from src, which holds what was read already). A denial resets the run's
// end.
func (f *flow) tunnel(src io.Reader, r Request) {
	v := f.g.decideFor(f, r)
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
	if !f.setUpstream(up) {
		return
	}
	relay(f.client, src, up)
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
		addrs, err = g.cfg.Resolve(ctx, host)
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
// passed on as a half close.
func relay(client *gonet.TCPConn, src io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, src)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, up)
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
