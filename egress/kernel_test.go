package egress

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

// kernelGateway starts a gateway on a kernel capture's sockets with no
// rewrite in front of them (no root needed): a TCP listener and a UDP
// socket on loopback, as the init would hand them over.
func kernelGateway(t *testing.T) (*Gateway, net.Addr, net.Addr) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	lf, _ := ln.File()
	uf, _ := uc.File()
	taddr, uaddr := ln.Addr(), uc.LocalAddr()
	ln.Close()
	uc.Close()
	g, err := New(Config{Stream: lf, Datagram: uf})
	if err != nil {
		t.Fatal(err)
	}
	g.SetDecider(func(Request) Verdict { return Verdict{Decision: "allow"} })
	t.Cleanup(func() { g.Close() })
	return g, taddr, uaddr
}

// resolverConn is a kernelGateway and a UDP socket connected to its
// resolver.
func resolverConn(t *testing.T) (*Gateway, net.Conn) {
	t.Helper()
	g, _, uaddr := kernelGateway(t)
	c, err := net.Dial("udp4", uaddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return g, c
}

// aQuery is a query for web.test's A record.
func aQuery(id uint16) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("web.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	return q
}

// TestKernelCaptureRefusesUnrewritten: a connection made straight to the
// capture's socket (its destination the run's loopback, or unknown to
// conntrack) is reset, even with a decider that allows everything.
func TestKernelCaptureRefusesUnrewritten(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g, taddr, _ := kernelGateway(t)
	if g.Stack() != "kernel" {
		t.Fatalf("stack %q", g.Stack())
	}
	defer g.Close()
	// The reset may come before the dial has seen its handshake end.
	c, err := net.Dial("tcp4", taddr.String())
	n := 0
	if err == nil {
		defer c.Close()
		c.Write([]byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err = c.Read(make([]byte, 100))
	}
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read %d, %v; want a reset", n, err)
	}
}

// TestKernelCaptureResolver: the capture's UDP socket answers DNS as the
// netstack's resolver does, and stops with Close.
func TestKernelCaptureResolver(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g, c := resolverConn(t)
	defer g.Close()
	c.Write(aQuery(7))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil || m.ID != 7 || len(m.Answers) != 1 {
		t.Fatalf("answer %+v, %v", m, err)
	}
	if name, ok := g.names.name(netip.AddrFrom4(m.Answers[0].Body.(*dnsmessage.AResource).A)); !ok || name != "web.test" {
		t.Fatalf("the answer stands for %q", name)
	}
}

// TestNewWithoutLink: no sockets, or only half of the kernel capture's, is
// an error, and what was given is closed.
func TestNewWithoutLink(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no link accepted")
	}
	r, w, _ := os.Pipe()
	defer w.Close()
	if _, err := New(Config{Stream: r}); err == nil {
		t.Fatal("a stream without a datagram socket accepted")
	}
	if _, err := r.Stat(); err == nil {
		t.Fatal("the stream was left open")
	}
}

// TestResolverRate: one run's resolver answers at most queryRate queries
// a second after a burst of queryBurst; a run that asked 33,000 a second
// had the daemon answer every one (the attacker's review of the kernel
// capture). The bound is checked against the time the queries took.
func TestResolverRate(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g, c := resolverConn(t)
	defer g.Close()
	const batches, batch = 30, 100
	buf := make([]byte, 512)
	answered := 0
	start := time.Now()
	for i := 0; i < batches; i++ {
		for j := 0; j < batch; j++ {
			c.Write(aQuery(uint16(i*batch + j)))
		}
		// This batch's answers: until none comes for 10 ms.
		for got := 0; got < batch; got++ {
			c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			if _, err := c.Read(buf); err != nil {
				break
			}
			answered++
		}
	}
	elapsed := time.Since(start)
	if bound := queryBurst + int(queryRate*elapsed.Seconds()) + 10; answered > bound || answered < queryBurst/2 {
		t.Errorf("%d of %d queries answered in %v; want between %d and %d", answered, batches*batch, elapsed, queryBurst/2, bound)
	}
}
