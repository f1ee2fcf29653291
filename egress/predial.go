package egress

import "bufio"

// Dialling ahead (docs/performance.md, "Inspected HTTPS"): a new
// connection to an inspected host is not decided before its first
// request, and the server's TLS handshake used to begin only then, after
// the run's. When a request to the same target was allowed in this run,
// in the generation and context in force now, the gateway dials and
// verifies the server while the run's handshake and first request are
// under way: nothing is sent to the server before that request is
// decided, and the connection is used only when its decision was made in
// the same generation and context (exchange), else closed unused. A run
// that was never allowed a request to the target has nothing dialled
// ahead: the server learns of no connection a decision did not let
// through before.

// reachedAt is when a request to a target was last allowed.
type reachedAt struct {
	gen uint64
	ctx string
}

// reach notes that a request to t was allowed in generation gen and
// context ctx.
func (g *Gateway) reach(t target, gen uint64, ctx string) {
	g.reachedMu.Lock()
	defer g.reachedMu.Unlock()
	if g.reached == nil {
		g.reached = map[target]reachedAt{}
	}
	if len(g.reached) >= maxReached {
		clear(g.reached) // a run reaching many hosts gets no dialling ahead
	}
	g.reached[t] = reachedAt{gen, ctx}
}

// maxReached bounds the targets a gateway remembers.
const maxReached = 256

// predial starts dialling t ahead when a request to it was allowed in
// the generation in force now; the channel gives the connection (pending,
// not the flow's until exchange adopts it) or nil. nil channel: nothing
// dialled.
func (f *flow) predial(t target) <-chan *upstreamConn {
	g := f.g
	g.reachedMu.Lock()
	at, ok := g.reached[t]
	g.reachedMu.Unlock()
	if !ok || at.gen != g.gen.Load() {
		return nil
	}
	ch := make(chan *upstreamConn, 1)
	go func() {
		c, addr, why := g.dial(t.host, t.port)
		raw := c
		if c != nil && why == "" {
			c, why = g.verifiedTLS(c, t.host)
		}
		if c == nil || why != "" {
			ch <- nil // the request dials again, and is told why
			return
		}
		ch <- &upstreamConn{t: t, c: c, raw: raw, br: bufio.NewReaderSize(c, 32<<10), gen: at.gen, ctx: at.ctx, pending: true, addr: addr}
	}()
	return ch
}

// takePredial is what *ch gave, waited for, and forgets ch; nil: nil.
func takePredial(ch *<-chan *upstreamConn) *upstreamConn {
	if *ch == nil {
		return nil
	}
	u := <-*ch
	*ch = nil
	return u
}

// dropPredial closes what *ch gave, unused.
func dropPredial(ch *<-chan *upstreamConn) {
	if u := takePredial(ch); u != nil {
		u.raw.Close()
	}
}
