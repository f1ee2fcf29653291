package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/capture"
)

// The kernel capture of a run whose network is "policy" (Link.Capture
// "kernel"): no link leaves the run's network namespace. Its loopback
// carries the run's address and a default route, and nftables rules of
// the namespace's own send every TCP connection and every DNS query, to
// any address, to two sockets the init binds at CaptureAddr and hands the
// daemon; everything else is dropped before it is tracked. The kernel's
// own TCP serves both ends, so the gateway relays between two kernel
// sockets (splice) instead of running a stack of its own.
var CaptureAddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 255, 0, 1}), 1)

// Capture kinds (Link.Capture), as internal/capture spells them.
const (
	CaptureAuto     = capture.Auto     // kernel where the kernel has nftables NAT, else netstack
	CaptureKernel   = capture.Kernel   // nftables in the run's namespace, kernel TCP both ways
	CaptureNetstack = capture.Netstack // a veth pair, the gateway's own stack on a packet socket
)

// conntrackTimeouts shorten how long the run's namespace tracks a flow
// after it ends: a program that opens and closes connections in a loop
// must not hold the kernel's table (nf_conntrack_max entries per
// namespace) with the default two minutes of TIME_WAIT.
var conntrackTimeouts = map[string]string{
	"nf_conntrack_tcp_timeout_time_wait": "2",
	"nf_conntrack_tcp_timeout_close":     "2",
	"nf_conntrack_tcp_timeout_fin_wait":  "10",
	"nf_conntrack_tcp_timeout_last_ack":  "10",
	"nf_conntrack_tcp_timeout_syn_sent":  "10",
	"nf_conntrack_udp_timeout":           "5",
	"nf_conntrack_udp_timeout_stream":    "10",
}

// errNoNAT: the kernel refused the capture's nftables rules.
var errNoNAT = errors.New("nftables NAT")

// captureUp builds the kernel capture in the init's network namespace
// (loopback already up) and returns the listening TCP socket and the UDP
// socket the gateway serves; the init passes them to the daemon.
func captureUp(l *Link) ([]int, error) {
	run := netip.MustParseAddr(l.Addr).As4()
	// The rules first, in one batch: when the kernel has no nftables NAT
	// nothing is left behind, and the netstack link may be built instead
	// (errNoNAT). Any later failure is the run's.
	if err := captureRules(run); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoNAT, err)
	}
	for k, v := range conntrackTimeouts {
		if err := os.WriteFile("/proc/sys/net/netfilter/"+k, []byte(v), 0); err != nil {
			return nil, fmt.Errorf("conntrack: %w", err)
		}
	}
	var fds []int
	fail := func(err error) ([]int, error) {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, err
	}
	for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM} {
		fd, err := captureSocket(typ)
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fail(err)
	}
	if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(run[:]), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fail(fmt.Errorf("address: %w", err))
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Src: net.IP(run[:]),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}); err != nil {
		return fail(fmt.Errorf("default route: %w", err))
	}
	return fds, nil
}

// captureSocket binds a socket of typ at CaptureAddr (listening, for TCP).
func captureSocket(typ int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("capture socket: %w", err)
	}
	sa := &unix.SockaddrInet4{Addr: CaptureAddr.Addr().As4(), Port: int(CaptureAddr.Port())}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind capture socket: %w", err)
	}
	if typ == unix.SOCK_STREAM {
		if err := unix.Listen(fd, 1024); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("listen: %w", err)
		}
	}
	return fd, nil
}

// captureRules installs, in one transaction:
//
//	table ip condfs {
//	  chain raw {   # output, before conntrack: untracked, refused at once
//	    type filter hook output priority raw; policy drop
//	    ip daddr 127.0.0.0/8 accept; ip daddr RUN accept
//	    ip saddr RUN meta l4proto tcp accept; ip saddr RUN udp dport 53 accept
//	  }
//	  chain nat {
//	    type nat hook output priority dstnat; policy accept
//	    ip daddr 127.0.0.0/8 return; ip daddr RUN return
//	    meta l4proto { tcp, udp } dnat to CaptureAddr
//	  }
//	}
//
// The run's own loopback and address stay the run's; what it sends to any
// other address is a TCP connection or DNS query for the gateway, or
// nothing (EPERM). What leaves for the gateway leaves from the run's
// address: conntrack then holds at most one entry per source port of it
// (the rewritten flows all end at CaptureAddr), where a program sending
// from addresses of 127/8 as well made the run's namespace track a flow
// per address and port, up to the host's nf_conntrack_max (229,162 in
// 15 s, 56 MB of kernel memory).
func captureRules(run [4]byte) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "condfs"})
	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	raw := c.AddChain(&nftables.Chain{Name: "raw", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw, Policy: &drop})
	nat := c.AddChain(&nftables.Chain{Name: "nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	loop := daddrIn([]byte{127, 0, 0, 0}, []byte{255, 0, 0, 0})
	self := daddrIn(run[:], []byte{255, 255, 255, 255})
	fromRun := addrIn(12, run[:], []byte{255, 255, 255, 255})
	tcp := slices.Concat(fromRun, l4proto(unix.IPPROTO_TCP))
	dns := slices.Concat(fromRun, l4proto(unix.IPPROTO_UDP), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, 53)}})
	for _, m := range [][]expr.Any{loop, self, tcp, dns} {
		c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: slices.Concat(m, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
	}
	for _, m := range [][]expr.Any{loop, self} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: slices.Concat(m, []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}})})
	}
	to := CaptureAddr.Addr().As4()
	dnat := []expr.Any{
		&expr.Immediate{Register: 1, Data: to[:]},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, CaptureAddr.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
	for _, p := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: slices.Concat(l4proto(p), dnat)})
	}
	return c.Flush()
}

// daddrIn matches an IPv4 destination within addr/mask.
func daddrIn(addr, mask []byte) []expr.Any { return addrIn(16, addr, mask) }

// addrIn matches the IPv4 address at offset off of the header (12 the
// source, 16 the destination) within addr/mask.
func addrIn(off uint32, addr, mask []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}
}

// l4proto matches the transport protocol p.
func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}
