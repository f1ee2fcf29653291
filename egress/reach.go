package egress

import (
	"context"
	"net/netip"
	"strings"
)

// unreachable resolves t's host as dial does and says why no address of
// it may be reached ("" when one may), with the request a CONNECT to t
// stands for and the first address refused. A CONNECT is answered only
// once its target resolves to an address the run may reach: a name that
// resolves only to refused addresses gets 403 with why, as a plain HTTP
// request does, never 200 and then a reset.
func (g *Gateway) unreachable(t target) (Request, Verdict, netip.Addr, string) {
	r := Request{Host: t.host, Port: t.port, Protocol: "https"}
	v, _ := g.anyAllowed(t)
	ctx, cancel := context.WithTimeout(g.ctx, dialWait)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(t.host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = g.cfg.Resolve(ctx, t.host+".")
		if err != nil || len(addrs) == 0 {
			return r, v, netip.Addr{}, "the name does not resolve"
		}
	}
	why := ""
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		p := g.private(a)
		if p == "" || g.cfg.Reach != nil && g.cfg.Reach(a) {
			return r, v, netip.Addr{}, ""
		}
		if why == "" {
			why = strings.TrimSpace(t.host + " resolves to " + a.String() + ", " + p + ", which reach_private does not list")
		}
	}
	return r, v, addrs[0].Unmap(), why
}
