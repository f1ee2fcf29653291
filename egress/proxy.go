package egress

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// proxy serves the gateway's HTTP proxy: CONNECT host:port, whose tunnel is
// then served as a captured connection to host:port is, and absolute-form
// plain-HTTP requests, each decided on its own.
func (f *flow) proxy(br *bufio.Reader) {
	_ = f.client.SetReadDeadline(time.Now().Add(headWait))
	b, err := br.Peek(8)
	_ = f.client.SetReadDeadline(time.Time{})
	if err != nil {
		return
	}
	if strings.HasPrefix(string(b), "CONNECT ") {
		f.connect(br)
		return
	}
	f.serveHTTP(br, nil)
}

// connect serves one CONNECT. When both https and tcp are denied for
// host:port, the program gets 403 with the reasons at once (a tunnel that
// would carry plain HTTP is refused with them: its paths are not known
// yet), and so it does when host resolves to no address the run may reach
// (unreachable); otherwise 200, and the tunnel is classified and decided
// as any captured connection, and reset when denied.
func (f *flow) connect(br *bufio.Reader) {
	_ = f.client.SetReadDeadline(time.Now().Add(headWait))
	hosts, err := requestHead(br)
	if err != nil {
		f.status(http.StatusBadRequest, "the request cannot be read: "+err.Error())
		return
	}
	req, err := http.ReadRequest(br)
	_ = f.client.SetReadDeadline(time.Time{})
	if err != nil {
		f.status(http.StatusBadRequest, "the request cannot be read: "+err.Error())
		return
	}
	t, err := parseHostPort(req.RequestURI, -1)
	if err != nil || t.port < 0 {
		f.status(http.StatusBadRequest, "CONNECT takes host:port; got "+strconv.Quote(req.RequestURI))
		return
	}
	if len(hosts) > 1 {
		f.status(http.StatusBadRequest, "a request must carry at most one Host header")
		return
	}
	if len(hosts) == 1 {
		if hh, err := parseHostPort(hosts[0], t.port); err != nil || hh != t {
			f.status(http.StatusBadRequest, "the Host header names "+hosts[0]+", not the CONNECT target "+req.RequestURI)
			return
		}
	}
	if req.ContentLength > 0 || len(req.TransferEncoding) > 0 {
		f.status(http.StatusBadRequest, "a CONNECT carries no body")
		return
	}
	// A tunnel to an inspected host is decided request by request
	// (inspect.go): nothing to decide before them.
	if v, ok := f.g.anyAllowed(t); !ok && !f.g.inspected(t.host) {
		r := Request{Host: t.host, Port: t.port, Protocol: "https"}
		f.g.audit(Event{Request: r, Verdict: v})
		f.status(http.StatusForbidden, refusal(r, v, ""))
		return
	}
	if r, v, addr, why := f.g.unreachable(t); why != "" {
		f.g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: why})
		f.status(http.StatusForbidden, refusal(r, v, why))
		return
	}
	if _, err := f.client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	f.captured(br, t.host, t.port)
}

// anyAllowed reports whether https or tcp to t is allowed now; the verdict
// returned is the https one (what a CONNECT usually carries).
func (g *Gateway) anyAllowed(t target) (Verdict, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var first Verdict
	for i, p := range []string{"https", "tcp"} {
		v := g.verdict(Request{Host: t.host, Port: t.port, Protocol: p})
		if i == 0 {
			first = v
		}
		if v.Allowed() {
			return v, true
		}
	}
	return first, false
}
