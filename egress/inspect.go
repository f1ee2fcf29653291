package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Inspected HTTPS (docs/sandbox.md, "Inspected HTTPS"): for the hosts the
// config names, the gateway terminates the run's TLS with a leaf of the
// daemon's Authority, decides each HTTP/1.1 or HTTP/2 request as plain HTTP's are
// (protocol "https", method and path: the same checkRequest, the same
// normalPath), writes it again, and sends it over a TLS connection of its
// own that verifies the server for the decided name. Secrets: the run's
// environment holds placeholders (SetSecrets); the gateway puts a
// secret's value into the header values of a request to a host the secret
// lists, in the session's context at that moment, and refuses every other
// request that carries a placeholder (a leak attempt).
//
// Fail-closed choices: the leaf is presented only for the SNI of the
// decided host; h2 and http/1.1 are offered by ALPN, and an HTTP/2
// stream's request goes through exchange as an HTTP/1.1 request does
// (inspect_h2.go); a TLS layer inside the terminated
// one is not HTTP and is refused; a server that fails verification
// answers 502; a placeholder the gateway cannot replace refuses the
// request; trailers are refused; an upstream connection serves one
// connection of the run, one request at a time, in one context.

// Inspection is how a gateway terminates HTTPS.
type Inspection struct {
	// Authority signs the leaves the run is shown.
	Authority *Authority
	// Inspected reports whether host's HTTPS is terminated, as the
	// config is now.
	Inspected func(host string) bool
	// Roots verifies servers (the host's roots and upstream_ca), as the
	// config is now; nil: the system's.
	Roots func() *x509.CertPool
	// Secret is the value of secret name for a request to host:port,
	// when the secret lists host:port and its when holds in the
	// session's context now; otherwise why not. nil: no secret is ever
	// put in.
	Secret func(name, host string, port int) (value, why string)
}

// tlsRefusal begins why a server was refused after its TLS handshake.
const tlsRefusal = "the server's TLS"

// inspected reports whether host's HTTPS is terminated now.
func (g *Gateway) inspected(host string) bool {
	in := g.cfg.Inspect
	return in != nil && in.Authority != nil && in.Inspected != nil && in.Inspected(host)
}

// SetSecrets sets the placeholders of the command that runs now, each to
// its secret's name (nil: none). Those of the command before stay known
// (a request carrying one is a leak attempt like any other placeholder's,
// not an unknown string), those of older commands are forgotten: a kept
// sandbox running commands in a loop holds two commands' worth.
func (g *Gateway) SetSecrets(placeholders map[string]string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := make(map[string]string, len(placeholders)+len(g.lastSecrets))
	for p, n := range g.lastSecrets {
		m[p] = n
	}
	for p, n := range placeholders {
		m[p] = n
	}
	g.lastSecrets = placeholders
	g.placeholders.Store(&m)
}

// https serves a TLS connection to host:port: terminated when host is
// inspected now, else relayed as decided by its SNI.
func (f *flow) https(br *bufio.Reader, host string, port int) {
	if f.g.inspected(host) {
		f.inspectTLS(br, host, port)
		return
	}
	f.tunnelTLS(br, host, port)
}

// inspectTLS terminates a TLS connection to host:port and serves its
// requests. Nothing is decided before the first request: there is no
// method or path to decide yet.
func (f *flow) inspectTLS(br *bufio.Reader, host string, port int) {
	r := Request{Host: host, Port: port, Protocol: "https"}
	refuse := func(why string) {
		f.refuse()
		f.g.audit(Event{Request: r, Verdict: Verdict{Decision: "deny", Reasons: []string{why}}})
	}
	a := f.g.cfg.Inspect.Authority
	var sni string
	var pre <-chan *upstreamConn
	conf := runTLSConfig(func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		sni = h.ServerName
		if sni == "" || canonicalHost(sni) != host {
			return nil, errors.New("the client hello names another host")
		}
		if pre == nil {
			// The server's handshake beside the run's (predial.go).
			pre = f.predial(target{host: host, port: port})
		}
		return f.g.leaf(h.Context(), a, host)
	})
	bc := &batchConn{Conn: bufferedConn{f.client, br}}
	tc := tls.Server(bc, conf)
	ctx, cancel := context.WithTimeout(f.g.ctx, headWait)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		dropPredial(&pre)
		if sni != "" && canonicalHost(sni) != host {
			refuse("the client hello names " + strconv.Quote(sni) + ", not " + strconv.Quote(host))
		} else {
			refuse("the TLS handshake with the run failed: " + err.Error())
		}
		return
	}
	f.mu.Lock()
	if f.cutDone {
		f.mu.Unlock()
		dropPredial(&pre)
		return
	}
	// The run's end is now the terminated connection; abort still resets
	// the socket beneath it.
	term := terminated{tc, f.client, bc}
	f.client = term
	f.mu.Unlock()
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		f.serveH2(term, target{host: host, port: port}, pre)
		return
	}
	f.serveRequests(bufio.NewReaderSize(f.client, 32<<10), &target{host: host, port: port}, "https", pre)
}

// runTLSConfig is the TLS server's config toward the run, its leaf from
// leaf.
func runTLSConfig(leaf func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// HTTP/2 first, as servers prefer it; both are decided per
		// request (inspect_h2.go).
		NextProtos: []string{"h2", "http/1.1"},
		// The run's clients do not resume; a ticket is work for nothing.
		SessionTicketsDisabled: true,
		// Whole records from the first byte: an answer is written in
		// large writes (answer.go), and what the run's client waits for
		// first is the answer's head, which fits in one record anyway.
		DynamicRecordSizingDisabled: true,
		GetCertificate:              leaf,
	}
}

// leaf is host's leaf for a handshake of the run: one the CA does not
// hold takes one of the run's mints (leafRate), waited for while ctx
// allows, refused after.
func (g *Gateway) leaf(ctx context.Context, a *Authority, host string) (*tls.Certificate, error) {
	if c := a.cached(host, time.Now()); c != nil {
		return c, nil
	}
	if err := g.mints.Wait(ctx); err != nil {
		return nil, fmt.Errorf("over %d new inspected hosts a second: %w", leafRate, err)
	}
	return a.Leaf(host)
}

// verifiedTLS is c, dialled for host, as an ordinary verifying TLS client:
// the certificate must be valid for host under the configured roots. nil
// and why (starting with tlsRefusal) when it is not; c is closed then.
func (g *Gateway) verifiedTLS(c net.Conn, host string) (net.Conn, string) {
	var roots *x509.CertPool
	if in := g.cfg.Inspect; in != nil && in.Roots != nil {
		roots = in.Roots()
	}
	// No session cache: a resumed session would outlive a reload that
	// took its root out of upstream_ca, and would link the run's
	// connections of different contexts for the server.
	tc := tls.Client(newReadAhead(c), &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(g.ctx, dialWait)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, tlsRefusal + " for " + host + ": " + err.Error()
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
		c.Close()
		return nil, tlsRefusal + " for " + host + ": it chose " + strconv.Quote(p) + ", not http/1.1"
	}
	return tc, ""
}

// injected is what a request carries of the run's secrets: the names put
// in, and their values, to be kept out of what the server answers.
type injected struct {
	names  []string
	values map[string]string // value to placeholder
}

// redact writes the placeholder back where a server's answer echoes a
// value in a header.
func (in injected) redact(h http.Header) {
	if len(in.values) == 0 {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			for val, ph := range in.values {
				v = strings.ReplaceAll(v, val, ph)
			}
			h[k][i] = v
		}
	}
}

// secretsIn finds the run's placeholders in req (decided as r): each in a
// header value of a request to a host its secret lists, in the session's
// context now, is replaced by the value; one anywhere else refuses the
// request, with why (a leak attempt). The request line and header names
// never carry a value; a plain-HTTP request never does.
func (g *Gateway) secretsIn(req *http.Request, r Request) (injected, string) {
	var in injected
	pm := g.placeholders.Load()
	if pm == nil || len(*pm) == 0 {
		return in, ""
	}
	line := req.Method + " " + req.RequestURI + " " + r.Path
	for ph, name := range *pm {
		if strings.Contains(line, ph) {
			return in, leakWhy(name, "in the request line")
		}
	}
	var secret func(name, host string, port int) (string, string)
	if g.cfg.Inspect != nil {
		secret = g.cfg.Inspect.Secret
	}
	type edit struct {
		k string
		i int
		v string
	}
	var edits []edit
	for k, vs := range req.Header {
		// Header names arrive in canonical case ("X-Condfs-Secret-...").
		lk := strings.ToLower(k)
		for ph, name := range *pm {
			if strings.Contains(lk, strings.ToLower(ph)) {
				return in, leakWhy(name, "in a header name")
			}
		}
		for i, v := range vs {
			nv := v
			for ph, name := range *pm {
				if !strings.Contains(nv, ph) {
					continue
				}
				switch {
				case r.Protocol != "https" || r.Method == "":
					return in, leakWhy(name, "in a plain-HTTP request to "+r.Host)
				case secret == nil:
					return in, leakWhy(name, "in a request to "+r.Host+": no secret is served")
				}
				val, why := secret(name, r.Host, r.Port)
				if why != "" {
					return in, leakWhy(name, "in a request to "+r.Host+": "+why)
				}
				nv = strings.ReplaceAll(nv, ph, val)
				if in.values == nil {
					in.values = map[string]string{}
				}
				in.values[val] = ph
				in.names = appendOnce(in.names, name)
			}
			if nv != v {
				edits = append(edits, edit{k: k, i: i, v: nv})
			}
		}
	}
	for _, e := range edits {
		req.Header[e.k][e.i] = e.v
	}
	return in, ""
}

// leakInHead finds a placeholder of the run in what decides where a
// request goes (its method, target and Host values: HTTP/2's pseudo-
// headers), to fixed: a leak attempt, with the request as far as it is
// known, before the request is read as anything else.
func (g *Gateway) leakInHead(req *http.Request, hosts []string, fixed target, proto string) (Request, string) {
	pm := g.placeholders.Load()
	if pm == nil || len(*pm) == 0 {
		return Request{}, ""
	}
	r := Request{Host: fixed.host, Port: fixed.port, Protocol: proto}
	parts := append([]string{req.Method, req.RequestURI, req.Host}, hosts...)
	for ph, name := range *pm {
		for _, p := range parts {
			if strings.Contains(p, ph) {
				return r, leakWhy(name, "in the request line or its host")
			}
		}
	}
	return r, ""
}

func leakWhy(name, where string) string {
	return "leak attempt: the placeholder of secret " + name + " " + where
}

func appendOnce(l []string, s string) []string {
	for _, x := range l {
		if x == s {
			return l
		}
	}
	return append(l, s)
}

// bodyScan passes a request's body on and stops it at the first
// placeholder of the run whose secret the request may not carry (a body
// never carries a value: it is not replaced, and to a host the secret
// does not list it is a leak attempt), and at trailers.
type bodyScan struct {
	rc    io.ReadCloser
	g     *Gateway
	r     Request
	phs   map[string]string
	tail  []byte // the last bytes passed on, for a placeholder split across reads
	keep  int
	req   *http.Request
	mu    sync.Mutex
	found string
}

// scanAhead is how much of a body is read, and scanned, before anything
// of its request is sent, when the run holds placeholders: a body that
// ends within it and carries a placeholder it may not is refused before
// the server reads a byte; a longer one is stopped where one shows, its
// request left unfinished.
const scanAhead = 64 << 10

// scanBody sets req's body to a scan of it; leak says what it stopped
// before anything was sent, and the scan's leak what it stopped later.
func (g *Gateway) scanBody(req *http.Request, r Request) (*bodyScan, string) {
	b := &bodyScan{g: g, r: r, req: req}
	pm := g.placeholders.Load()
	if req.Body == nil || req.Body == http.NoBody {
		return b, ""
	}
	b.rc = req.Body
	if pm != nil {
		b.phs = *pm
		for ph := range b.phs {
			b.keep = max(b.keep, len(ph)-1)
		}
	}
	req.Body = b
	if len(b.phs) == 0 {
		return b, ""
	}
	ahead := make([]byte, scanAhead)
	n, err := io.ReadFull(b, ahead)
	if b.leak() != "" {
		return b, b.leak()
	}
	rest := io.Reader(b)
	if err != nil {
		rest = eofAfter{err}
	}
	req.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(ahead[:n]), rest), b}
	return b, ""
}

// eofAfter ends a body that was read whole ahead (io.ErrUnexpectedEOF
// from ReadFull is its end, not an error).
type eofAfter struct{ err error }

func (e eofAfter) Read([]byte) (int, error) {
	if e.err == io.ErrUnexpectedEOF {
		return 0, io.EOF
	}
	return 0, e.err
}

var errLeak = errors.New("the request was stopped: a leak attempt")

func (b *bodyScan) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if errors.Is(err, errTrailers) {
		b.set("request trailers are not forwarded")
		return 0, errLeak
	}
	if n > 0 && len(b.phs) > 0 {
		buf := append(b.tail, p[:n]...)
		for ph, name := range b.phs {
			if bytes.Contains(buf, []byte(ph)) {
				why := "in a body"
				if secret := b.g.cfg.Inspect; b.r.Protocol == "https" && secret != nil && secret.Secret != nil {
					if _, w := secret.Secret(name, b.r.Host, b.r.Port); w == "" {
						continue // a listed host may be sent the placeholder itself
					}
				}
				b.set(leakWhy(name, why+" to "+b.r.Host))
				return 0, errLeak
			}
		}
		if len(buf) > b.keep {
			buf = buf[len(buf)-b.keep:]
		}
		b.tail = append(b.tail[:0], buf...)
	}
	if err == io.EOF && len(b.req.Trailer) > 0 {
		b.set("request trailers are not forwarded")
		return 0, errLeak
	}
	return n, err
}

func (b *bodyScan) Close() error { return b.rc.Close() }

func (b *bodyScan) set(why string) {
	b.mu.Lock()
	b.found = why
	b.mu.Unlock()
}

// leak is why the body was stopped, or "".
func (b *bodyScan) leak() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.found
}

// bufferedConn is a connection whose first bytes were read into br.
type bufferedConn struct {
	net.Conn
	br *bufio.Reader
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.br.Read(p) }

// terminated is the run's end of a terminated connection: TLS over the
// socket, half-closed as TLS closes (close_notify).
type terminated struct {
	*tls.Conn
	raw clientConn
	// batch is the socket beneath Conn, whose writes an answer's body
	// gathers (answer.go).
	batch *batchConn
}

func (c terminated) CloseWrite() error { return c.Conn.CloseWrite() }

var _ clientConn = terminated{}
