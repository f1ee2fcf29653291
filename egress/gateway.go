package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
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

// Request is one decision's arguments: tool `connect`'s args.
type Request struct {
	Host     string // the name asked for, or the literal address
	Port     int
	Protocol string // "http", "https" or "tcp"
	Method   string // http only
	Path     string // http only: normalised, with the query as sent
}

// Args is r as the policy's `connect` call takes it.
func (r Request) Args() map[string]any {
	m := map[string]any{"host": r.Host, "port": r.Port, "protocol": r.Protocol}
	if r.Protocol == "http" {
		m["method"], m["path"] = r.Method, r.Path
	}
	return m
}

// Verdict is the policy's answer.
type Verdict struct {
	Decision string // "allow", "deny" or "approval_required"
	Reasons  []string
}

// Allowed reports whether v lets the connection or request through.
func (v Verdict) Allowed() bool { return v.Decision == "allow" }

// Decider decides a request in the session's context as it is now.
type Decider func(Request) Verdict

// Event is one decision as audited: the request, the verdict, the address
// dialled (when one was), and why an allowed request was refused all the
// same (Refused: a private address, an SNI that names another host, a
// host that cannot be reached).
type Event struct {
	Request
	Verdict
	Addr    netip.Addr
	Refused string
}

// Config is a gateway's.
type Config struct {
	// Link is the gateway's end of the run's pair: an AF_PACKET socket
	// bound to it. The gateway owns it from New on (closed by Close, and
	// by New when it fails).
	Link *os.File
	// Resolve looks up an allowed name; nil: the system's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Reach reports whether [sandbox] reach_private admits a; nil: none.
	Reach func(netip.Addr) bool
	// Connections bounds the run's open connections (0: 256).
	Connections int
	// Session and Node bound the open connections of every gateway that
	// shares them (the daemon gives each session's runs one, and the node
	// one); nil: no bound beyond Connections.
	Session, Node *Slots
	// Audit is told of every decision; nil: nobody.
	Audit func(Event)
	Log   *slog.Logger
}

const (
	nicID = 1
	// sniffWait is how long a connection may stay silent before it is
	// classified "tcp" (a protocol whose server speaks first).
	sniffWait = 500 * time.Millisecond
	// headWait bounds a client hello's or a request head's arrival.
	headWait = 10 * time.Second
	// idleWait ends an HTTP connection between requests.
	idleWait = 90 * time.Second
	dialWait = 10 * time.Second
	// maxDNSFlows bounds the resolver's open exchanges.
	maxDNSFlows = 64
)

// Slots bounds open connections across gateways.
type Slots struct{ c chan struct{} }

// NewSlots makes n slots.
func NewSlots(n int) *Slots { return &Slots{c: make(chan struct{}, n)} }

// InUse is how many slots are taken.
func (s *Slots) InUse() int {
	if s == nil {
		return 0
	}
	return len(s.c)
}

func (s *Slots) take() bool {
	if s == nil {
		return true
	}
	select {
	case s.c <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Slots) give() {
	if s != nil {
		<-s.c
	}
}

// What one connection may hold in the stack: its windows toward and from
// the run. Small enough that Connections of them stay a bounded cost
// (docs/sandbox.md), large enough for the link's speed.
const (
	minBuffer     = 4 << 10
	defaultBuffer = 64 << 10
	maxBuffer     = 128 << 10
)

// Gateway is one run's egress gateway.
type Gateway struct {
	cfg    Config
	stack  *stack.Stack
	names  *names
	decide atomic.Pointer[Decider]
	host   hostAddrs
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slots  chan struct{} // one per open connection
	dns    chan struct{} // one per open DNS exchange

	// mu orders decisions against Recheck: a decision and the recording
	// of what it decided happen under its read lock, Recheck under its
	// write lock, so no connection decided with a context older than
	// Recheck's escapes it.
	mu    sync.RWMutex
	flows map[*flow]struct{}

	closeOnce sync.Once
}

// New starts the gateway on cfg.Link. Until SetDecider, every connection
// is denied.
func New(cfg Config) (*Gateway, error) {
	if cfg.Link == nil {
		return nil, errors.New("egress: no link")
	}
	if cfg.Connections <= 0 {
		cfg.Connections = 256
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{cfg: cfg, names: newNames(), ctx: ctx, cancel: cancel, flows: map[*flow]struct{}{},
		slots: make(chan struct{}, cfg.Connections), dns: make(chan struct{}, maxDNSFlows)}
	if err := g.start(); err != nil {
		cancel()
		cfg.Link.Close()
		return nil, fmt.Errorf("egress: %w", err)
	}
	return g, nil
}

func (g *Gateway) start() error {
	fd := int(g.cfg.Link.Fd())
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

// SetDecider sets how the run's connections are decided from now on (a
// kept sandbox's next command may have other roles). Open connections
// keep their decision until Recheck.
func (g *Gateway) SetDecider(d Decider) {
	g.mu.Lock()
	g.decide.Store(&d)
	g.mu.Unlock()
}

// Close ends every connection and the stack, and closes the link.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		g.cancel()
		g.mu.Lock()
		for f := range g.flows {
			f.cut()
		}
		g.mu.Unlock()
		g.stack.Destroy()
		g.wg.Wait()
		g.cfg.Link.Close()
	})
	return nil
}

// Recheck decides every open connection again, as the Decider decides now,
// and cuts those it refuses; it returns once they are cut. It returns how
// many it cut.
func (g *Gateway) Recheck() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for f := range g.flows {
		r := f.decided.Load()
		if r == nil {
			continue
		}
		v := g.verdict(*r)
		why := ""
		switch a := f.dialled(); {
		case !v.Allowed():
			why = "cut: the context or the policy changed"
		case a.IsValid() && g.private(a) != "" && (g.cfg.Reach == nil || !g.cfg.Reach(a)):
			why = "cut: reach_private no longer lists " + a.String()
		}
		if why != "" {
			g.audit(Event{Request: *r, Verdict: v, Addr: f.dialled(), Refused: why})
			f.cut()
			delete(g.flows, f)
			n++
		}
	}
	return n
}

// verdict asks the Decider; the caller holds g.mu. No Decider, or one that
// panics, denies.
func (g *Gateway) verdict(r Request) (v Verdict) {
	d := g.decide.Load()
	if d == nil {
		return Verdict{Decision: "deny", Reasons: []string{"the run's connections are not decided yet"}}
	}
	defer func() {
		if p := recover(); p != nil {
			v = Verdict{Decision: "deny", Reasons: []string{fmt.Sprintf("the decision failed: %v", p)}}
		}
	}()
	return (*d)(r)
}

// adopt makes c, dialled at addr for f's request r, f's upstream, under
// the read lock Recheck excludes: a reload that took addr out of
// reach_private while the dial was in flight is seen here (or by Recheck,
// which then sees the address). false: c is closed, f refused.
func (g *Gateway) adopt(f *flow, r Request, v Verdict, c net.Conn, addr netip.Addr) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.private(addr) != "" && (g.cfg.Reach == nil || !g.cfg.Reach(addr)) {
		c.Close()
		f.refuse()
		g.audit(Event{Request: r, Verdict: v, Addr: addr, Refused: "reach_private no longer lists " + addr.String()})
		return false
	}
	return f.setUpstream(c, addr)
}

// wouldAllow reports whether r would be allowed now, recording nothing.
func (g *Gateway) wouldAllow(r Request) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.verdict(r).Allowed()
}

// decideFor decides r for f and records it, so that Recheck sees it.
func (g *Gateway) decideFor(f *flow, r Request) Verdict {
	g.mu.RLock()
	defer g.mu.RUnlock()
	v := g.verdict(r)
	if v.Allowed() {
		f.decided.Store(&r)
	}
	return v
}

func (g *Gateway) audit(e Event) {
	if g.cfg.Audit != nil {
		g.cfg.Audit(e)
	}
}

// onTCP takes every TCP connection the run opens.
func (g *Gateway) onTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	select {
	case g.slots <- struct{}{}:
	default:
		r.Complete(true) // over [sandbox] connections: reset
		return
	}
	if !g.cfg.Session.take() {
		<-g.slots
		r.Complete(true) // over the session's bound: reset
		return
	}
	if !g.cfg.Node.take() {
		g.cfg.Session.give()
		<-g.slots
		r.Complete(true) // over the node's bound: reset
		return
	}
	release := func() {
		g.cfg.Node.give()
		g.cfg.Session.give()
		<-g.slots
	}
	var wq waiter.Queue
	ep, e := r.CreateEndpoint(&wq)
	if e != nil {
		release()
		r.Complete(true)
		return
	}
	r.Complete(false)
	f := &flow{g: g, ep: ep, client: gonet.NewTCPConn(&wq, ep)}
	g.mu.Lock()
	if g.ctx.Err() != nil {
		g.mu.Unlock()
		ep.Abort()
		release()
		return
	}
	g.flows[f] = struct{}{}
	g.wg.Add(1)
	g.mu.Unlock()
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	go func() {
		defer g.wg.Done()
		defer release()
		defer g.forget(f)
		f.serve(dst, int(id.LocalPort))
	}()
}

func (g *Gateway) forget(f *flow) {
	g.mu.Lock()
	delete(g.flows, f)
	g.mu.Unlock()
	f.end()
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
			if a := g.answer(buf[:n]); a != nil {
				_, _ = c.Write(a)
			}
		}
	}()
	return true
}
