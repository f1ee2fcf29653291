package egress

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"syscall"
	"testing"
	"time"
)

// answerRig is a server on loopback, behind the gateway's copy loop with
// real TLS on both sides (forward and h1Answer, as an inspected HTTP/1.1
// connection runs them), and a TLS proxy written the simplest way in
// front of the same server, for comparison.
type answerRig struct {
	roots                *x509.CertPool
	srv, gateway, simple string // addresses
}

// newAnswerRig serves each request the server reads with serve, on the
// server's TLS connection (which it closes after).
func newAnswerRig(tb testing.TB, serve func(req *http.Request, c *tls.Conn)) *answerRig {
	a, err := LoadAuthority("")
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := a.Leaf("srv.test")
	if err != nil {
		tb.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.Cert())
	srv := rigListen(tb, func(c net.Conn) error {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*leaf}})
		req, err := http.ReadRequest(bufio.NewReader(tc))
		if err != nil {
			return nil
		}
		serve(req, tc)
		return tc.Close()
	})
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	g := &Gateway{ctx: ctx, cfg: Config{Inspect: &Inspection{Authority: a, Roots: func() *x509.CertPool { return roots }}}}
	t := target{host: "srv.test", port: srv.Addr().(*net.TCPAddr).Port}
	gateway := rigListen(tb, func(raw net.Conn) error {
		// As inspectTLS and serveRequests serve the run's connection.
		bc := &batchConn{Conn: raw}
		tc := tls.Server(bc, runTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return leaf, nil }))
		if err := tc.Handshake(); err != nil {
			return err
		}
		f := &flow{g: g, client: terminated{tc, raw.(*net.TCPConn), bc}}
		req, err := http.ReadRequest(bufio.NewReaderSize(f.client, 32<<10))
		if err != nil {
			return err
		}
		upRaw, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			return err
		}
		defer upRaw.Close()
		c, why := g.verifiedTLS(upRaw, t.host)
		if c == nil {
			return fmt.Errorf("%s", why)
		}
		up := &upstreamConn{t: t, c: c, raw: upRaw, br: bufio.NewReaderSize(c, 32<<10)}
		f.forward(req, Request{Host: t.host, Port: t.port, Protocol: "https", Method: req.Method, Path: req.URL.Path}, t, up, injected{}, h1Answer{f})
		return tc.Close()
	})
	simple := rigListen(tb, func(raw net.Conn) error {
		tc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{*leaf}})
		req, err := http.ReadRequest(bufio.NewReader(tc))
		if err != nil {
			return err
		}
		up, err := tls.Dial("tcp", srv.Addr().String(), &tls.Config{ServerName: t.host, RootCAs: roots})
		if err != nil {
			return err
		}
		defer up.Close()
		if err := req.Write(up); err != nil {
			return err
		}
		if _, err := io.Copy(tc, up); err != nil {
			return err
		}
		return tc.Close()
	})
	return &answerRig{roots: roots, srv: srv.Addr().String(), gateway: gateway.Addr().String(), simple: simple.Addr().String()}
}

// rigListen serves each connection of a listener on loopback with serve.
func rigListen(tb testing.TB, serve func(net.Conn) error) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// What went wrong shows in what the client reads.
				_ = serve(c)
			}()
		}
	}()
	return ln
}

// get sends GET path to addr over TLS verified for srv.test and returns
// the answer, its body to be read.
func (r *answerRig) get(addr, path string) (*http.Response, *tls.Conn, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "srv.test", RootCAs: r.roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: srv.test\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return resp, c, nil
}

// TestAnswerBodyWhole: a large answer reaches the run byte for byte,
// framed by Content-Length or chunked as the server framed it.
func TestAnswerBodyWhole(t *testing.T) {
	body := make([]byte, 3<<20+12345)
	rand.Read(body)
	r := newAnswerRig(t, func(req *http.Request, c *tls.Conn) {
		if req.URL.Path == "/chunked" {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			cw := httputil.NewChunkedWriter(c)
			for b := body; len(b) > 0; {
				n := min(len(b), 7000)
				cw.Write(b[:n])
				b = b[n:]
			}
			cw.Close()
			io.WriteString(c, "\r\n")
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(body))
		for b := body; len(b) > 0; {
			n := min(len(b), 100000)
			c.Write(b[:n])
			b = b[n:]
		}
	})
	for _, path := range []string{"/length", "/chunked"} {
		resp, c, err := r.get(r.gateway, path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		got, err := io.ReadAll(resp.Body)
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if chunked := len(resp.TransferEncoding) > 0; chunked != (path == "/chunked") || (!chunked && resp.ContentLength != int64(len(body))) {
			t.Errorf("%s: framed as %v, length %d", path, resp.TransferEncoding, resp.ContentLength)
		}
		if sha256.Sum256(got) != sha256.Sum256(body) {
			t.Errorf("%s: %d bytes arrived, not the %d the server sent", path, len(got), len(body))
		}
	}
}

// TestAnswerStreams: what a server has sent of an answer reaches the run
// before the server sends more, framed either way; nothing waits for a
// buffer to fill.
func TestAnswerStreams(t *testing.T) {
	next := make(chan bool)
	r := newAnswerRig(t, func(req *http.Request, c *tls.Conn) {
		chunked := req.URL.Path == "/chunked"
		if chunked {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		} else {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n")
		}
		for _, part := range []string{"event 1\n", "end\n"} {
			if chunked {
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part)
			} else {
				io.WriteString(c, part)
			}
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				return
			}
		}
		if chunked {
			io.WriteString(c, "0\r\n\r\n")
		}
	})
	for _, path := range []string{"/length", "/chunked"} {
		resp, c, err := r.get(r.gateway, path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 8)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "event 1\n" {
			t.Errorf("%s: the first part did not arrive before the server sent more: %q, %v", path, buf, err)
		}
		next <- true
		buf = buf[:4]
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "end\n" {
			t.Errorf("%s: the second part did not arrive before the server ended: %q, %v", path, buf, err)
		}
		next <- true
		if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) > 0 {
			t.Errorf("%s: after the end: %q, %v", path, rest, err)
		}
		c.Close()
	}
}

// BenchmarkInspectDownload: one 64 MiB GET (Content-Length given, written
// a MiB at a time) through the gateway's copy loop, against the same
// download through the simple proxy and straight from the server, in one
// run, all on loopback in this process. cpu-us/MiB is the whole
// process's (server, client and the proxy between them); the gateway's
// own is its figure less direct's. BenchmarkEgressInspect in bench/
// measures the daemon.
//
//	go test -run '^$' -bench InspectDownload -benchtime 5x ./egress/
func BenchmarkInspectDownload(b *testing.B) {
	const size = 64 << 20
	chunk := make([]byte, 1<<20)
	r := newAnswerRig(b, func(req *http.Request, c *tls.Conn) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		for i := 0; i < size/len(chunk); i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for _, c := range []struct{ name, addr string }{{"direct", r.srv}, {"simple-proxy", r.simple}, {"gateway", r.gateway}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			cpu0 := processCPU()
			for b.Loop() {
				resp, conn, err := r.get(c.addr, "/bulk")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
				conn.Close()
				if err != nil || n != size {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N)/(size>>20), "cpu-us/MiB")
		})
	}
}

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestReadAheadRecord: the read-ahead follows TLS records' boundaries
// through what it passes on in small reads, and says a record can be
// finished only when the rest of it is buffered.
func TestReadAheadRecord(t *testing.T) {
	rec := func(n int) []byte { return append([]byte{23, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...) }
	// Three records, the third in two writes.
	r0, r1, r2 := rec(10), rec(30), rec(3000)
	s2 := len(r0) + len(r1)
	first := append(append(append([]byte{}, r0...), r1...), r2[:100]...)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		b.Write(first)
		b.Write(append(r2[100:], rec(1)...))
	}()
	ra := newReadAhead(a)
	p := make([]byte, 7)
	for d := 0; d < len(first); {
		n, err := ra.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		d += n
		// Within the first two records, or at the second's start, what is
		// left of a record is buffered; from the third's start it is not.
		if want := d < s2; ra.record() != want {
			t.Fatalf("after %d bytes: record %v, want %v", d, ra.record(), want)
		}
	}
	// The rest of the third record and a fourth arrive in one read.
	if _, err := ra.Read(p); err != nil {
		t.Fatal(err)
	}
	if !ra.record() {
		t.Fatal("the rest of the third record is buffered, and record says not")
	}
}
