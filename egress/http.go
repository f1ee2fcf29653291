package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// target is where a request goes: a host as decided and its port.
type target struct {
	host string
	port int
}

func (t target) hostPort(defaultPort int) string {
	h := t.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if t.port == defaultPort {
		return h
	}
	return h + ":" + strconv.Itoa(t.port)
}

// upstreamConn is the connection requests of one target share, in one
// context: a request decided in another context, or after a switch or a
// reload (Recheck) since it was dialled, dials again. Both are checked: a
// switch publishes the new context before its Recheck, and a request
// decided in between must not reuse a connection of the old one.
type upstreamConn struct {
	t   target
	c   net.Conn // what requests are written to: raw, or TLS over it
	raw net.Conn // the socket: what is closed (a TLS close waits to write)
	br  *bufio.Reader
	gen uint64 // the gateway's generation when decided and dialled
	ctx string // the context it was decided in (Verdict.Context)
	// pending: dialled ahead of a request (predial), not yet the flow's.
	pending bool
	addr    netip.Addr
}

// defaultPort is proto's port when a Host header names none.
func defaultPort(proto string) int {
	if proto == "https" {
		return 443
	}
	return 80
}

// serveHTTP serves plain-HTTP requests, each decided on its own: to fixed
// (a captured connection, whose Host must name it), or, when fixed is nil,
// to the host of each absolute-form request (the proxy). It returns when
// the connection should end.
func (f *flow) serveHTTP(br *bufio.Reader, fixed *target) { f.serveRequests(br, fixed, "http", nil) }

// serveRequests serves the requests of a connection speaking HTTP/1.x as
// proto: "http", or "https" on a connection the gateway terminated
// (inspect.go), whose requests it sends over TLS it verifies. Both are
// decided, refused and written again the same way (exchange), as are
// HTTP/2's (inspect_h2.go).
//
// pre, when not nil, gives an upstream connection dialled ahead (predial)
// for the first request.
func (f *flow) serveRequests(br *bufio.Reader, fixed *target, proto string, pre <-chan *upstreamConn) {
	var up *upstreamConn
	defer func() {
		dropPredial(&pre)
		if up != nil && up.pending {
			up.raw.Close()
		} else if up != nil {
			f.dropUpstream(up.raw)
		}
	}()
	a := h1Answer{f}
	for first := true; ; first = false {
		wait := headWait
		if !first {
			wait = idleWait
		}
		_ = f.client.SetReadDeadline(time.Now().Add(wait))
		hosts, err := requestHead(br)
		if err != nil {
			if !first && isEOF(err) {
				return
			}
			f.status(http.StatusBadRequest, "the request cannot be read: "+err.Error())
			return
		}
		req, err := http.ReadRequest(br)
		_ = f.client.SetReadDeadline(time.Time{})
		if err != nil {
			f.status(http.StatusBadRequest, "the request cannot be read: "+err.Error())
			return
		}
		if up == nil {
			up = takePredial(&pre)
		}
		if !f.exchange(req, hosts, fixed, proto, &up, a) {
			return
		}
	}
}

// answerer answers the run's request: over HTTP/1.1 on the connection
// itself (h1Answer), or on an HTTP/2 stream (h2Answer).
type answerer interface {
	// status answers code and msg; over HTTP/1.1 it ends the connection.
	status(code int, msg string)
	// answer relays the server's answer (an interim one too), read
	// from up.
	answer(resp *http.Response, up *upstreamConn) error
}

// exchange serves one request of the run, read as req with hosts its Host
// values (HTTP/2's :authority): checked, decided, written again and sent
// over *up, which is dialled again when it was dialled for another target,
// in another context or before a Recheck. It reports whether the run's
// connection may carry another request over *up.
func (f *flow) exchange(req *http.Request, hosts []string, fixed *target, proto string, up **upstreamConn, a answerer) bool {
	if fixed != nil {
		if r, leak := f.g.leakInHead(req, hosts, *fixed, proto); leak != "" {
			f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "deny", Reasons: []string{leak}}, Refused: leak})
			a.status(http.StatusForbidden, refusal(r, Verdict{}, leak))
			return false
		}
	}
	t, r, code, msg := checkRequest(req, hosts, fixed, proto)
	if code != 0 {
		a.status(code, msg)
		return false
	}
	v, gen := f.g.decideFor(f, r)
	if !v.Allowed() {
		f.g.audit(Event{Request: r, Verdict: v})
		a.status(http.StatusForbidden, refusal(r, v, ""))
		return false
	}
	sec, leak := f.g.secretsIn(req, r)
	if leak != "" {
		f.g.audit(Event{Request: r, Verdict: v, Refused: leak})
		a.status(http.StatusForbidden, refusal(r, v, leak))
		return false
	}
	if proto == "https" {
		f.g.reach(t, gen, v.Context)
	}
	if u := *up; u != nil && u.pending {
		// Dialled ahead (predial): used when this request was decided in
		// the generation and context it was dialled for.
		*up = nil
		if u.t == t && u.gen == gen && u.ctx == v.Context {
			f.g.audit(Event{Request: r, Verdict: v, Addr: u.addr, Secrets: sec.names})
			if !f.g.adopt(f, r, v, u.raw, u.addr) {
				a.status(http.StatusForbidden, refusal(r, v, "reach_private no longer lists "+u.addr.String()))
				return false
			}
			u.pending = false
			*up = u
			return f.forward(req, r, t, u, sec, a)
		}
		u.raw.Close()
	}
	if u := *up; u == nil || u.t != t || u.gen != gen || u.ctx != v.Context {
		if u != nil {
			f.dropUpstream(u.raw)
			*up = nil
		}
		c, addr, why := f.g.dial(t.host, t.port)
		raw := c
		if c != nil && proto == "https" {
			c, why = f.g.verifiedTLS(c, t.host)
		}
		f.g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: why, Secrets: sec.names})
		if c == nil {
			code := http.StatusForbidden
			if addr.IsValid() && proto == "https" && strings.HasPrefix(why, tlsRefusal) {
				code = http.StatusBadGateway
			}
			a.status(code, refusal(r, v, why))
			return false
		}
		// The flow holds the socket: a cut resets it at once (a TLS
		// close would wait to write its alert, under the gateway's
		// lock).
		if !f.g.adopt(f, r, v, raw, addr) {
			a.status(http.StatusForbidden, refusal(r, v, "reach_private no longer lists "+addr.String()))
			return false
		}
		*up = &upstreamConn{t: t, c: c, raw: raw, br: bufio.NewReaderSize(c, 32<<10), gen: gen, ctx: v.Context}
	} else {
		f.g.audit(Event{Request: r, Verdict: v, Secrets: sec.names})
	}
	return f.forward(req, r, t, *up, sec, a)
}

// forward sends req upstream with exactly r's path and relays the answer;
// it reports whether the connection may serve another request.
func (f *flow) forward(req *http.Request, r Request, t target, up *upstreamConn, sec injected, a answerer) bool {
	p, q, _ := strings.Cut(r.Path, "?")
	req.URL = &url.URL{Opaque: p, RawQuery: q, ForceQuery: strings.Contains(r.Path, "?") && q == ""}
	req.Host = t.hostPort(defaultPort(r.Protocol))
	req.RequestURI = ""
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization"} {
		req.Header.Del(h)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // nothing added
	}
	body, leak := f.g.scanBody(req, r)
	if leak != "" {
		f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "allow"}, Refused: leak})
		a.status(http.StatusForbidden, refusal(r, Verdict{}, leak))
		return false
	}
	if err := req.Write(up.c); err != nil {
		if leak := body.leak(); leak != "" {
			// The upstream has not had the whole request: it is closed
			// unfinished, and the program told why.
			f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "allow"}, Refused: leak})
			a.status(http.StatusForbidden, refusal(r, Verdict{}, leak))
			return false
		}
		a.status(http.StatusBadGateway, "the request could not be sent: "+err.Error())
		return false
	}
	for {
		resp, err := http.ReadResponse(up.br, req)
		if err != nil {
			a.status(http.StatusBadGateway, "the answer could not be read: "+err.Error())
			return false
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			resp.Body.Close()
			a.status(http.StatusBadGateway, "the server switched protocols, which is not forwarded")
			return false
		}
		sec.redact(resp.Header)
		werr := a.answer(resp, up)
		resp.Body.Close()
		if werr != nil {
			return false
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue // an interim answer: the final one follows
		}
		// An upstream that was sent a body is not used again: what a
		// server left of it unread must not answer the next request.
		return !req.Close && !resp.Close && req.ContentLength == 0 && len(req.TransferEncoding) == 0
	}
}

// checkRequest finds req's target and its decision's arguments, or the
// status that refuses it: its Host header must name its target (exactly
// one, as HTTP/1.1 requires), and upgrades and CONNECT are not forwarded.
func checkRequest(req *http.Request, hosts []string, fixed *target, proto string) (target, Request, int, string) {
	bad := func(code int, format string, a ...any) (target, Request, int, string) {
		return target{}, Request{}, code, fmt.Sprintf(format, a...)
	}
	if len(hosts) != 1 {
		return bad(http.StatusBadRequest, "a request must carry exactly one Host header (it has %d)", len(hosts))
	}
	dport := defaultPort(proto)
	hh, err := parseHostPort(hosts[0], dport)
	if err != nil {
		return bad(http.StatusBadRequest, "Host %q: %v", hosts[0], err)
	}
	var t target
	switch {
	case fixed != nil:
		if req.URL.Host != "" || req.URL.Scheme != "" {
			if ut, err := parseHostPort(req.URL.Host, dport); err != nil || ut != *fixed || req.URL.Scheme != proto {
				return bad(http.StatusBadRequest, "the request's target %q is not this connection's host", req.URL.Host)
			}
		}
		t = *fixed
	default:
		if req.Method == http.MethodConnect {
			return bad(http.StatusBadRequest, "CONNECT is not forwarded inside a connection")
		}
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			return bad(http.StatusBadRequest, "the proxy takes absolute http:// targets (and CONNECT); got %q", req.RequestURI)
		}
		if t, err = parseHostPort(req.URL.Host, 80); err != nil {
			return bad(http.StatusBadRequest, "target %q: %v", req.URL.Host, err)
		}
	}
	if hh != t {
		return bad(http.StatusBadRequest, "the Host header names %s, not the request's target %s", hosts[0], t.hostPort(dport))
	}
	if req.Method == http.MethodConnect {
		return bad(http.StatusMethodNotAllowed, "CONNECT is not forwarded inside a connection")
	}
	if req.Header.Get("Upgrade") != "" {
		return bad(http.StatusNotImplemented, "protocol upgrades are not forwarded")
	}
	if len(req.Trailer) > 0 || req.Header.Get("Trailer") != "" {
		// What trailers would carry arrives after the request was
		// decided and its head sent.
		return bad(http.StatusBadRequest, "request trailers are not forwarded")
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete, http.MethodTrace:
		// A server that does not read such a request's body would read it
		// as a request of its own, which nobody decided.
		if req.ContentLength != 0 || len(req.TransferEncoding) > 0 {
			return bad(http.StatusBadRequest, "a %s request carries no body here", req.Method)
		}
	}
	path, err := normalPath(req)
	if err != nil {
		return bad(http.StatusBadRequest, "the request's path: %v", err)
	}
	return t, Request{Host: t.host, Port: t.port, Protocol: proto, Method: req.Method, Path: path}, 0, ""
}

// parseHostPort reads host[:port] as decided (canonicalHost).
func parseHostPort(s string, defaultPort int) (target, error) {
	host, port := s, defaultPort
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return target{}, errors.New("not a port")
		}
		host, port = h, n
	}
	h := canonicalHost(host)
	if h == "" {
		return target{}, errors.New("not a host name or address")
	}
	return target{h, port}, nil
}

// requestHead checks the head of the request br holds, without taking it:
// no obsolete line folding (a header a server could read otherwise), under
// br's size; it returns the Host header values.
func requestHead(br *bufio.Reader) ([]string, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := headEnd(buf); end >= 0 {
			return headHosts(buf[:end])
		}
		if br.Buffered() == br.Size() {
			return nil, fmt.Errorf("the request head is over %d bytes", br.Size())
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, err
		}
	}
}

// headEnd is where the head in buf ends (its blank line), or -1.
func headEnd(buf []byte) int {
	for i := 0; i < len(buf); {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return -1
		}
		line := bytes.TrimSuffix(buf[i:i+j], []byte("\r"))
		if len(line) == 0 && i > 0 {
			return i
		}
		i += j + 1
	}
	return -1
}

func headHosts(head []byte) ([]string, error) {
	var hosts []string
	lines := strings.Split(string(head), "\n")
	for _, l := range lines[1:] {
		l = strings.TrimSuffix(l, "\r")
		if l == "" {
			continue
		}
		if l[0] == ' ' || l[0] == '\t' {
			return nil, errors.New("a folded header line")
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || name != strings.TrimSpace(name) {
			return nil, fmt.Errorf("header line %q", l)
		}
		if strings.EqualFold(name, "Host") {
			hosts = append(hosts, strings.TrimSpace(value))
		}
	}
	return hosts, nil
}

// status answers the run's request with code and msg, and ends it.
func (f *flow) status(code int, msg string) {
	body := msg + "\n"
	_ = f.client.SetWriteDeadline(time.Now().Add(headWait))
	fmt.Fprintf(f.client, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// refusal is the body of a 403: what was decided and why.
func refusal(r Request, v Verdict, why string) string {
	s := "condfs: " + r.Protocol + " " + r.Host + ":" + strconv.Itoa(r.Port)
	if r.Method != "" {
		s += " " + r.Method + " " + r.Path
	}
	if why != "" {
		return s + ": refused: " + why
	}
	s += ": " + v.Decision
	if len(v.Reasons) > 0 {
		s += ": " + strings.Join(v.Reasons, "; ")
	}
	return s
}

// isEOF: the program ended the connection, or let it idle out, between
// requests.
func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || isTimeout(err)
}
