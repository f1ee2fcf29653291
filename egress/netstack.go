package egress

// The netstack capture (sandbox.CaptureNetstack): the run's veth pair ends
// in an AF_PACKET socket the daemon holds, served by gVisor's tcpip stack.
// Every TCP connection and DNS query of the run ends in that stack.

import (
	"fmt"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// What one connection may hold in the stack: its windows toward and from
// the run. Small enough that Connections of them stay a bounded cost
// (docs/sandbox.md), large enough for the link's speed.
const (
	minBuffer     = 4 << 10
	defaultBuffer = 64 << 10
	maxBuffer     = 128 << 10
)

func (g *Gateway) startNetstack() error {
	fd := int(g.cfg.Packet.Fd())
	ep, err := fdbased.New(&fdbased.Options{FDs: []int{fd}, MTU: MTU, EthernetHeader: true,
		Address: tcpip.LinkAddress(GatewayMAC), PacketDispatchMode: fdbased.RecvMMsg,
		// The run's kernel leaves checksums to an offload a veth never does.
		RXChecksumOffload: true, GSOMaxSize: 65536})
	if err != nil {
		return fmt.Errorf("link: %w", err)
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	g.stack = s
	fail := func(what string, e tcpip.Error) error {
		s.Destroy()
		return fmt.Errorf("%s: %s", what, e)
	}
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: minBuffer, Default: defaultBuffer, Max: maxBuffer}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: minBuffer, Default: defaultBuffer, Max: maxBuffer}
	moderate := tcpip.TCPModerateReceiveBufferOption(false)
	for _, o := range []tcpip.SettableTransportProtocolOption{&rcv, &snd, &moderate} {
		if e := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); e != nil {
			return fail("buffers", e)
		}
	}
	// The handlers first: the NIC delivers from its creation on.
	fwd := tcp.NewForwarder(s, 0, g.cfg.Connections, g.onTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udp.NewForwarder(s, g.onUDP).HandlePacket)
	if e := s.CreateNIC(nicID, ep); e != nil {
		return fail("nic", e)
	}
	// Every destination is the gateway's to answer: promiscuous takes
	// packets to any address, spoofing answers from it.
	if e := s.SetPromiscuousMode(nicID, true); e != nil {
		return fail("promiscuous", e)
	}
	if e := s.SetSpoofing(nicID, true); e != nil {
		return fail("spoofing", e)
	}
	pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(GatewayAddr.As4()).WithPrefix()}
	if e := s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); e != nil {
		return fail("address", e)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	return nil
}

// onTCP takes every TCP connection the run opens.
//
// The connection takes its place among the bounds (admit) only once its
// handshake is done: CreateEndpoint waits for the run's last ACK, and a
// handshake the run abandons lasts until gVisor's SYN-ACK retransmissions
// give up (about two minutes). A flood of SYNs from a run held every
// place of its session and of the node for that long, after the run
// had ended; the handshakes in flight are bounded by the forwarder
// instead (Config.Connections per run).
func (g *Gateway) onTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	var wq waiter.Queue
	ep, e := r.CreateEndpoint(&wq)
	if e != nil {
		r.Complete(true)
		return
	}
	r.Complete(false)
	f := &flow{g: g, client: gonet.NewTCPConn(&wq, ep), abort: ep.Abort}
	release, ok := g.admit(f)
	if !ok {
		ep.Abort() // over a bound: reset
		return
	}
	if !g.serveFlow(f, netip.AddrFrom4(id.LocalAddress.As4()), int(id.LocalPort), release) {
		ep.Abort()
		release()
	}
}

// onUDP takes every UDP datagram the run sends: DNS (port 53, to any
// server) is answered by the run's resolver; the rest goes nowhere.
func (g *Gateway) onUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	if id.LocalPort != 53 {
		return true // handled: dropped
	}
	select {
	case g.dns <- struct{}{}:
	default:
		return true
	}
	var wq waiter.Queue
	ep, e := r.CreateEndpoint(&wq)
	if e != nil {
		<-g.dns
		return true
	}
	c := gonet.NewUDPConn(&wq, ep)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() { <-g.dns }()
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			// One exchange serves a resolver's A and AAAA and retries.
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := c.Read(buf)
			if err != nil || g.ctx.Err() != nil {
				return
			}
			if !g.queries.Allow() {
				continue // over queryRate
			}
			if a := g.answer(buf[:n]); a != nil {
				_, _ = c.Write(a)
			}
		}
	}()
	return true
}
