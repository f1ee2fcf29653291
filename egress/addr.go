package egress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// refusedRanges are never dialled unless Config.Reach admits them: the
// host's and its networks' own (loopback, link-local with the cloud
// metadata address, RFC 1918, unique local, shared 100.64/10), and what
// names no one host (multicast, unspecified, broadcast, "this network").
var refusedRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "64:ff9b:1::/48", "fc00::/7", "fe80::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// private says why a is refused as a destination ("" when it is not): one
// of refusedRanges, or an address of the host itself. An IPv4-mapped IPv6
// address is its IPv4 address. NAT64's well-known prefix carries any IPv4
// address, so its embedded address is judged too.
func (g *Gateway) private(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() && netip.MustParsePrefix("64:ff9b::/96").Contains(a) {
		b := a.As16()
		if r := g.private(netip.AddrFrom4([4]byte(b[12:]))); r != "" {
			return r
		}
	}
	for _, p := range refusedRanges {
		if p.Contains(a) {
			return "a local, private or reserved address (" + p.String() + ")"
		}
	}
	if g.host.has(a) {
		return "an address of this host"
	}
	return ""
}

// hostAddrs caches the host's own addresses for a second: the interfaces
// change rarely, and a connection should not pay a netlink dump.
type hostAddrs struct {
	mu   sync.Mutex
	at   time.Time
	addr map[netip.Addr]bool
}

func (h *hostAddrs) has(a netip.Addr) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) > time.Second || h.addr == nil {
		m := map[netip.Addr]bool{}
		if l, err := net.InterfaceAddrs(); err == nil {
			for _, x := range l {
				if n, ok := x.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(n.IP); ok {
						m[ip.Unmap()] = true
					}
				}
			}
			h.addr, h.at = m, time.Now()
		} else if h.addr == nil {
			// Without the list, every address could be the host's:
			// refuse until it can be read.
			return true
		}
	}
	return h.addr[a]
}
