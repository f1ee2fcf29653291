package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Link is the run's end of its egress gateway (Network "policy"): one veth
// pair in the run's network namespace, the run's end with Addr and a
// default route via Peer, the other end with PeerMAC and no address. The
// init hands the daemon an AF_PACKET socket bound to that other end; the
// gateway answers there for Peer and for every address the run dials.
type Link struct {
	Addr, Peer string // IPv4 addresses
	PeerMAC    string
	MTU        int
	// Capture is how the run's connections reach the gateway: CaptureKernel
	// (capture.go), CaptureNetstack (the pair above), or CaptureAuto.
	Capture string
}

// The pair's names inside the run.
const (
	linkName     = "eth0"
	linkPeerName = "gateway0"
)

func (l *Link) validate() error {
	if l == nil {
		return errors.New(`network "policy" needs a link`)
	}
	a, err1 := netip.ParseAddr(l.Addr)
	p, err2 := netip.ParseAddr(l.Peer)
	_, err3 := net.ParseMAC(l.PeerMAC)
	if err1 != nil || err2 != nil || err3 != nil || !a.Is4() || !p.Is4() || l.MTU < 1280 || l.MTU > 65535 {
		return fmt.Errorf("link %+v: want two IPv4 addresses, a MAC and an MTU", *l)
	}
	switch l.Capture {
	case CaptureAuto, CaptureKernel, CaptureNetstack:
		return nil
	}
	return fmt.Errorf("link capture %q: want kernel, netstack or none", l.Capture)
}

// Ends are the sockets of a run's egress link, as the init hands them over:
// Stream and Datagram for the kernel capture (every TCP connection the run
// makes is accepted on Stream; every DNS query arrives on Datagram), or
// Packet for the netstack pair. Fallback says why the kernel capture was
// not built when the link's Capture left the choice to the kernel.
type Ends struct {
	Stream, Datagram *os.File
	Packet           *os.File
	Fallback         string
}

func newEnds(fds []int, fallback string) (*Ends, error) {
	switch len(fds) {
	case 1:
		return &Ends{Packet: os.NewFile(uintptr(fds[0]), "egress-packet"), Fallback: fallback}, nil
	case 2:
		return &Ends{Stream: os.NewFile(uintptr(fds[0]), "egress-stream"),
			Datagram: os.NewFile(uintptr(fds[1]), "egress-datagram")}, nil
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return nil, errors.New("no egress link")
}

// Close closes the sockets e still holds.
func (e *Ends) Close() error {
	for _, f := range []*os.File{e.Stream, e.Datagram, e.Packet} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

// netUp builds the run's way to its gateway as l.Capture says, and returns
// the sockets the gateway serves (the init passes them to the daemon and
// closes them): the listening TCP socket and the UDP socket of the kernel
// capture, or the packet socket of the pair. With CaptureAuto, why the
// kernel capture could not be built, when the kernel has no nftables NAT
// (a failure after that is the run's: nothing is half built).
func netUp(l *Link) (fds []int, why string, err error) {
	if l.Capture != CaptureNetstack {
		fds, err := captureUp(l)
		if err == nil || l.Capture == CaptureKernel || !errors.Is(err, errNoNAT) {
			return fds, "", err
		}
		why = "kernel capture: " + err.Error()
	}
	fd, err := linkUp(l)
	if err != nil {
		return nil, why, err
	}
	return []int{fd}, why, nil
}

// linkUp builds l in the init's network namespace and returns the socket
// the gateway serves; the init passes it to the daemon and closes it.
func linkUp(l *Link) (int, error) {
	mac, _ := net.ParseMAC(l.PeerMAC)
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = linkName, l.MTU
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: linkPeerName, PeerMTU: uint32(l.MTU), PeerHardwareAddr: mac}); err != nil {
		return -1, fmt.Errorf("add veth: %w", err)
	}
	run, err := netlink.LinkByName(linkName)
	if err != nil {
		return -1, err
	}
	peer, err := netlink.LinkByName(linkPeerName)
	if err != nil {
		return -1, err
	}
	// The gateway's reader takes packets of at most 64 KiB less its
	// headers: the run's segmentation offload must not build larger ones.
	if err := netlink.LinkSetGSOMaxSize(run, l.MTU); err != nil {
		return -1, fmt.Errorf("gso size: %w", err)
	}
	addr, peerAddr := net.ParseIP(l.Addr).To4(), net.ParseIP(l.Peer).To4()
	host := net.CIDRMask(32, 32)
	if err := netlink.AddrAdd(run, &netlink.Addr{IPNet: &net.IPNet{IP: addr, Mask: host}, Peer: &net.IPNet{IP: peerAddr, Mask: host}}); err != nil {
		return -1, fmt.Errorf("address: %w", err)
	}
	for _, ln := range []netlink.Link{peer, run} {
		if err := netlink.LinkSetUp(ln); err != nil {
			return -1, fmt.Errorf("up %s: %w", ln.Attrs().Name, err)
		}
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: run.Attrs().Index, Gw: peerAddr}); err != nil {
		return -1, fmt.Errorf("default route: %w", err)
	}
	// Protocol 0 until bound: the socket takes nothing of other links.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	// The gateway must not read back what it sends. Each frame carries a
	// virtio-net header, so that checksums (and segmentation) are left to
	// the kernel both ways.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("packet socket: vnet header: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: peer.Attrs().Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind packet socket: %w", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
