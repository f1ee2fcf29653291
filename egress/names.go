package egress

import (
	"net/netip"
	"strings"
	"sync"
)

// maxNames bounds the names one run holds addresses for; the oldest is
// forgotten first. A forgotten name's address may stand for another name
// later: a program that kept it reaches that name, decided as that name.
const maxNames = 4096

// names gives each name the run resolves an address of nameRange.
type names struct {
	mu     sync.Mutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
	order  []netip.Addr // in the order given, a ring of maxNames
	next   uint32       // the host part of the next address to give
}

func newNames() *names {
	return &names{byName: map[string]netip.Addr{}, byAddr: map[netip.Addr]string{}}
}

// addr is name's address, given now if it has none.
func (n *names) addr(name string) netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.byName[name]; ok {
		return a
	}
	var a netip.Addr
	if len(n.order) >= maxNames {
		a = n.order[0]
		n.order = n.order[1:]
		delete(n.byName, n.byAddr[a])
	} else {
		n.next++
		// Host parts 1..65534 of the /16; maxNames is far below.
		a = netip.AddrFrom4([4]byte{198, 18, byte(n.next >> 8), byte(n.next)})
	}
	n.byName[name] = a
	n.byAddr[a] = name
	n.order = append(n.order, a)
	return a
}

// name is the name a stands for.
func (n *names) name(a netip.Addr) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.byAddr[a]
	return s, ok
}

// canonicalName is host as decided: lower case, no trailing dot; "" when it
// is not a DNS name (RFC 1035 lengths; letters, digits, '-' and '_').
func canonicalName(host string) string {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h == "" || len(h) > 253 {
		return ""
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 {
			return ""
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return ""
			}
		}
	}
	return h
}

// canonicalHost is a host as a connection names it: a DNS name
// (canonicalName) or an IP literal (IPv6 with or without brackets), as
// decided; "" when it is neither.
func canonicalHost(host string) string {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return ""
		}
		return a.Unmap().String()
	}
	if strings.ContainsAny(host, "[]") {
		return ""
	}
	n := canonicalName(host)
	if n == "" {
		return ""
	}
	// All digits and dots is an address in some parsers (010.1, 1.2.3):
	// refused rather than guessed at.
	if strings.Trim(n, "0123456789.") == "" {
		return ""
	}
	return n
}
