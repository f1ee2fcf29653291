package egress

// The kernel capture (sandbox.CaptureKernel): nftables rules in the run's
// network namespace send every TCP connection it makes to Config.Stream, a
// listening socket there, and every DNS query to Config.Datagram. The
// connection's original destination is what conntrack recorded before the
// rewrite (SO_ORIGINAL_DST). Both ends are kernel sockets, so the relay
// splices.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelBuffer bounds what the daemon's end of each connection toward the
// run holds in the kernel (SO_SNDBUF/SO_RCVBUF, which the kernel doubles):
// a program that stops reading holds no more there, and the upstream
// socket's autotuning sees a reader that stopped. The run's end is on
// loopback, so this costs no throughput (256 MiB at 1.8-2.2 GB/s with
// 512 KiB, 1 MiB, 2 MiB or the kernel's autotuning alike); upstream keeps
// the kernel's autotuning, for distant servers.
const kernelBuffer = 512 << 10

func (g *Gateway) startKernel() error {
	ln, err := net.FileListener(g.cfg.Stream)
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	pc, err := net.FilePacketConn(g.cfg.Datagram)
	if err != nil {
		ln.Close()
		return fmt.Errorf("datagram: %w", err)
	}
	tl, ok1 := ln.(*net.TCPListener)
	uc, ok2 := pc.(*net.UDPConn)
	if !ok1 || !ok2 {
		ln.Close()
		pc.Close()
		return errors.New("the capture's sockets are not TCP and UDP")
	}
	// Both are duplicates: the files are not needed any more.
	g.cfg.closeLink()
	g.cfg.Stream, g.cfg.Datagram = nil, nil
	g.front = []io.Closer{tl, uc}
	g.wg.Add(2)
	go g.acceptLoop(tl)
	go g.resolverLoop(uc)
	return nil
}

// acceptLoop takes every TCP connection the run opens, until Close.
func (g *Gateway) acceptLoop(ln *net.TCPListener) {
	defer g.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if g.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: the run's connections wait in
			// the backlog, nobody else's.
			g.cfg.Log.Warn("egress: accept", "err", err)
			select {
			case <-g.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		g.onStream(c)
	}
}

func resetConn(c *net.TCPConn) {
	_ = c.SetLinger(0)
	c.Close()
}

// onStream serves one connection of the run: to the address and port it
// was made to, before the capture's rewrite.
func (g *Gateway) onStream(c *net.TCPConn) {
	dst, err := originalDst(c)
	// A connection made to the capture's own socket (not rewritten: its
	// destination is the run's loopback) is nobody's to serve.
	if err != nil || dst.Addr().IsLoopback() {
		resetConn(c)
		return
	}
	f := &flow{g: g, client: c, abort: func() { resetConn(c) }}
	release, ok := g.admit(f)
	if !ok {
		resetConn(c) // over a bound
		return
	}
	_ = c.SetReadBuffer(kernelBuffer)
	_ = c.SetWriteBuffer(kernelBuffer)
	if !g.serveFlow(f, dst.Addr(), int(dst.Port()), release) {
		resetConn(c)
		release()
	}
}

// originalDst is where the run sent c: its destination before the
// capture's rewrite, as conntrack holds it.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// SO_ORIGINAL_DST answers a struct sockaddr_in, and takes no
		// other length.
		var sa unix.RawSockaddrInet4
		n := uint32(unix.SizeofSockaddrInet4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e != 0:
			serr = fmt.Errorf("original destination: %w", e)
		case sa.Family != unix.AF_INET || n != unix.SizeofSockaddrInet4:
			serr = fmt.Errorf("original destination of family %d", sa.Family)
		default:
			p := (*[2]byte)(unsafe.Pointer(&sa.Port))
			ap = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(p[0])<<8|uint16(p[1]))
		}
	})
	if err == nil {
		err = serr
	}
	return ap, err
}

// resolverLoop answers the run's DNS queries, to any server, until Close:
// the reply leaves the capture's socket for the query's source, and the
// kernel's rewrite gives it the server's address back.
func (g *Gateway) resolverLoop(c *net.UDPConn) {
	defer g.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if g.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !g.queries.Allow() {
			continue // over queryRate
		}
		if a := g.answer(buf[:n]); a != nil {
			_, _ = c.WriteToUDPAddrPort(a, from)
		}
	}
}
