package egress

import (
	"net/netip"

	"golang.org/x/net/dns/dnsmessage"
)

// answerTTL is what the resolver's answers say: long enough that programs
// keep their address, short enough that a forgotten one is asked again.
const answerTTL = 60

// answer is the run's resolver's reply to query, or nil when query is not a
// DNS query worth a reply. A name gets an address of nameRange (A); AAAA
// and every other type get no record (the run has no IPv6 route and no
// other use for them); a name that is not a DNS name gets NXDOMAIN.
// Nothing is looked up: the name is decided only when a connection uses it.
func (g *Gateway) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	resp := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if h.OpCode != 0 {
		resp.RCode = dnsmessage.RCodeNotImplemented
		return build(resp, &q, nil)
	}
	name := canonicalName(q.Name.String())
	switch {
	case name == "":
		resp.RCode = dnsmessage.RCodeNameError
		return build(resp, &q, nil)
	case q.Class != dnsmessage.ClassINET || q.Type != dnsmessage.TypeA:
		return build(resp, &q, nil)
	}
	a := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if name != "localhost" {
		a = g.names.addr(name)
	}
	return build(resp, &q, &dnsmessage.AResource{A: a.As4()})
}

func build(h dnsmessage.Header, q *dnsmessage.Question, a *dnsmessage.AResource) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(*q) != nil {
		return nil
	}
	if a != nil {
		if b.StartAnswers() != nil ||
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: answerTTL}, *a) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
