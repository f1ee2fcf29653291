package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/condfs/condfs/internal/capture"
)

// Request is one decision's arguments: tool `connect`'s args.
type Request struct {
	Host     string // the name asked for, or the literal address
	Port     int
	Protocol string // "http", "https" or "tcp"
	Method   string // http only
	Path     string // http only: normalised, with the query as sent
}

// Per request: Method and Path are set for plain HTTP and for HTTPS the
// gateway terminates (inspect.go); HTTPS decided by its SNI has neither.

// Args is r as the policy's `connect` call takes it.
func (r Request) Args() map[string]any {
	m := map[string]any{"host": r.Host, "port": r.Port, "protocol": r.Protocol}
	if r.Protocol == "http" || r.Method != "" {
		m["method"], m["path"] = r.Method, r.Path
	}
	return m
}

// Verdict is the policy's answer.
type Verdict struct {
	Decision string // "allow", "deny" or "approval_required"
	Reasons  []string
	// Context names the session's context the decision was made in
	// (any string that differs when the context does; "": one context).
	// An upstream connection serves only requests decided in the context
	// it was dialled in.
	Context string
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
	// Secrets names the secrets put into the request (never their values).
	Secrets []string
}

// Config is a gateway's.
type Config struct {
	// Stream and Datagram are the kernel capture's sockets in the run's
	// network namespace (sandbox.CaptureKernel): a listening TCP socket
	// that accepts every connection the run makes, and the UDP socket
	// every DNS query reaches. Packet, when they are nil, is the netstack
	// capture's AF_PACKET socket on the far end of the run's veth pair.
	// The gateway owns them from New on (closed by Close, and by New when
	// it fails).
	Stream, Datagram, Packet *os.File
	// Resolve looks up an allowed name; nil: the system's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Reach reports whether [sandbox] reach_private admits a; nil: none.
	Reach func(netip.Addr) bool
	// Connections bounds the run's open connections (0: 256).
	Connections int
	// Share bounds the open connections of every gateway of a session
	// together, and its part of the node's Pool; nil: no bound beyond
	// Connections.
	Share *Share
	// Audit is told of every decision; nil: nobody.
	Audit func(Event)
	// Inspect, when set, terminates HTTPS to the hosts it names and
	// decides each request (inspect.go); nil: HTTPS is decided by SNI.
	Inspect *Inspection
	Log     *slog.Logger
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

// Gateway is one run's egress gateway.
type Gateway struct {
	cfg    Config
	stack  *stack.Stack // the netstack capture's
	front  []io.Closer  // the kernel capture's sockets
	names  *names
	decide atomic.Pointer[Decider]
	host   hostAddrs
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slots  chan struct{} // one per open connection
	dns    chan struct{} // one per open DNS exchange
	// queries bounds the DNS queries of the run the resolver answers
	// (queryRate): a run made it answer 33,000 a second (86,000 on the
	// netstack capture), the daemon's CPU taken from every session.
	queries *rate.Limiter
	// mints bounds the leaves minted for the run's handshakes (leafRate).
	mints *rate.Limiter

	// mu orders decisions against Recheck: a decision and the recording
	// of what it decided happen under its read lock, Recheck under its
	// write lock, so no connection decided with a context older than
	// Recheck's escapes it.
	mu    sync.RWMutex
	flows map[*flow]struct{}
	// gen counts Rechecks: an upstream connection dialled under another
	// generation is not used for the next request (one context's
	// connection never carries another's requests).
	gen atomic.Uint64
	// placeholders are the current command's secrets: placeholder to
	// secret name (SetSecrets).
	placeholders atomic.Pointer[map[string]string]
	lastSecrets  map[string]string // the current command's, guarded by mu
	// reached is, per inspected target, the generation and context of
	// the last request to it that was allowed (predial).
	reachedMu sync.Mutex
	reached   map[target]reachedAt

	closeOnce sync.Once
}

// A run's resolver answers up to queryRate queries a second, queryBurst at
// once; the others go unanswered (a resolver asks again). A package
// manager resolves some hundreds of names in a whole install.
const (
	queryRate  = 1000
	queryBurst = 500
	// A run has up to leafBurst leaves minted at once, leafRate a second
	// after: the daemon's CA mints one at a time for every session and
	// caches maxLeaves.
	leafRate  = 20
	leafBurst = 64
)

func newMints() *rate.Limiter { return rate.NewLimiter(leafRate, leafBurst) }

// New starts the gateway on cfg's sockets. Until SetDecider, every
// connection is denied.
func New(cfg Config) (*Gateway, error) {
	kernel := cfg.Stream != nil && cfg.Datagram != nil
	if !kernel && cfg.Packet == nil {
		cfg.closeLink()
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
		slots: make(chan struct{}, cfg.Connections), dns: make(chan struct{}, maxDNSFlows),
		queries: rate.NewLimiter(queryRate, queryBurst), mints: newMints()}
	start := g.startNetstack
	if kernel {
		start = g.startKernel
	}
	if err := start(); err != nil {
		cancel()
		cfg.closeLink()
		return nil, fmt.Errorf("egress: %w", err)
	}
	return g, nil
}

func (c *Config) closeLink() {
	for _, f := range []*os.File{c.Stream, c.Datagram, c.Packet} {
		if f != nil {
			f.Close()
		}
	}
}

// Stack is the capture g serves: capture.Kernel or capture.Netstack.
func (g *Gateway) Stack() string {
	if g.stack != nil {
		return capture.Netstack
	}
	return capture.Kernel
}

// SetDecider sets how the run's connections are decided from now on (a
// kept sandbox's next command may have other roles). Open connections
// keep their decision until Recheck.
func (g *Gateway) SetDecider(d Decider) {
	g.mu.Lock()
	g.decide.Store(&d)
	g.mu.Unlock()
}

// Close ends every connection and the capture, and closes the link.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		g.cancel()
		g.mu.Lock()
		for f := range g.flows {
			f.cut()
		}
		g.mu.Unlock()
		for _, c := range g.front {
			c.Close()
		}
		if g.stack == nil {
			g.wg.Wait()
			g.cfg.closeLink()
			return
		}
		// Close aborts the stack's endpoints (what the flows read
		// returns at once); a handshake the run left half open is not
		// aborted, and gVisor waits for it to time out (about two
		// minutes). The run's end (and the daemon's) does not wait for
		// that: the stack finishes stopping in the background, and its
		// packet socket is closed only then, so that no reader of the
		// link is left on a descriptor number used again.
		g.stack.Close()
		g.wg.Wait()
		stopped := make(chan struct{})
		go func() {
			g.stack.Wait()
			g.cfg.closeLink()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(stackStopWait):
			g.cfg.Log.Info("egress: the run's network stack stops in the background (a handshake the run left half open)")
		}
	})
	return nil
}

// stackStopWait is how long Close waits for the netstack capture's stack
// to stop before it lets it stop in the background.
const stackStopWait = time.Second

// Recheck decides every open connection again, as the Decider decides now,
// and cuts those it refuses; it returns once they are cut. It returns how
// many it cut.
func (g *Gateway) Recheck() int {
	return g.cutIf(true, func(f *flow, r *Request) (Verdict, string) {
		if r == nil {
			return Verdict{}, "" // not decided yet: it will be as the Decider decides now
		}
		v := g.verdict(*r)
		if !v.Allowed() {
			return v, "cut: the context or the policy changed"
		}
		for _, a := range f.dialledAll() {
			if g.private(a) != "" && (g.cfg.Reach == nil || !g.cfg.Reach(a)) {
				return v, "cut: reach_private no longer lists " + a.String()
			}
		}
		return v, ""
	})
}

// CutAll cuts every open connection, audited with why (a kept sandbox's
// command ended: its connections end with it, as when its sandbox goes),
// and returns once they are cut.
func (g *Gateway) CutAll(why string) int {
	return g.cutIf(false, func(*flow, *Request) (Verdict, string) {
		return Verdict{Decision: "deny", Reasons: []string{why}}, why
	})
}

// cutIf cuts each open connection for which cut gives a reason, audited
// with its verdict, and returns how many it cut. With bump, it counts a
// generation first, under the same lock decisions take (decideFor): a
// request decided before it is rechecked here, one decided after it dials
// again.
func (g *Gateway) cutIf(bump bool, cut func(f *flow, r *Request) (Verdict, string)) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if bump {
		g.gen.Add(1)
	}
	n := 0
	for f := range g.flows {
		r := f.decided.Load()
		v, why := cut(f, r)
		if why == "" {
			continue
		}
		if r != nil {
			g.audit(Event{Request: *r, Verdict: v, Addr: f.dialled(), Refused: why})
		}
		f.cut()
		delete(g.flows, f)
		n++
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

// decideFor decides r for f and records it, so that Recheck sees it; gen
// is the generation it was decided in.
func (g *Gateway) decideFor(f *flow, r Request) (v Verdict, gen uint64) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	v = g.verdict(r)
	if v.Allowed() {
		f.decided.Store(&r)
	}
	return v, g.gen.Load()
}

func (g *Gateway) audit(e Event) {
	if g.cfg.Audit != nil {
		g.cfg.Audit(e)
	}
}

// admit takes a slot of the run's bound and of its session's Share for
// f; release gives them back. false: over one of them (the connection is
// reset). The Share may later evict f for a session holding fewer.
func (g *Gateway) admit(f *flow) (release func(), ok bool) {
	select {
	case g.slots <- struct{}{}:
	default:
		return nil, false // over [sandbox] connections
	}
	free, ok := g.cfg.Share.take(func() { g.evict(f) })
	if !ok {
		<-g.slots
		return nil, false
	}
	return func() {
		free()
		<-g.slots
	}, true
}

// evict cuts f, whose slot of the node's pool a session holding fewer
// connections took.
func (g *Gateway) evict(f *flow) {
	e := Event{Addr: f.dialled(), Refused: "cut: the node's connections are all held, and this session holds the most of its owner's, or its owner of the node's"}
	if r := f.decided.Load(); r != nil {
		e.Request, e.Verdict = *r, Verdict{Decision: "allow"}
	}
	g.audit(e)
	f.cut()
}

// serveFlow records f and serves it, to dst:port, in a goroutine of its
// own; false (nothing started) when the gateway is closed.
func (g *Gateway) serveFlow(f *flow, dst netip.Addr, port int, release func()) bool {
	g.mu.Lock()
	if g.ctx.Err() != nil {
		g.mu.Unlock()
		return false
	}
	g.flows[f] = struct{}{}
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		defer release()
		defer g.forget(f)
		f.serve(dst, port)
	}()
	return true
}

func (g *Gateway) forget(f *flow) {
	g.mu.Lock()
	delete(g.flows, f)
	g.mu.Unlock()
	f.end()
}
