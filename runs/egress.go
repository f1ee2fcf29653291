package runs

// The egress gateway of runs whose [sandbox] network is "policy": every
// connection and plain-HTTP request is the policy's tool `connect`, decided
// in the session's context as it is at that moment, audited, counted, and
// decided again on every context switch and reload (Node.Allow).

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"

	"github.com/condfs/condfs/constraints"
	"github.com/condfs/condfs/egress"
	"github.com/condfs/condfs/sandbox"
)

// nodeConnections bounds the egress connections of every run of the node
// at once, shared fairly among the owners and sessions (egress.Pool): at
// most 1024, and no more than an eighth of the daemon's descriptors hold
// (egressFDs each: they are kept from the views' open files, fsys's
// ReservedFDs). A connection whose program stops reading holds its windows
// and relay buffers in the daemon (about 0.7 MB of its RSS measured,
// TestEgressMemoryBoundedPerRun), which no run's memory limit counts: the node's
// total is bounded here (about 700 MB at most). Four sessions holding 256
// each ran a daemon with 2,048 descriptors out of them, and every session
// with it (TestEgressPoolLeavesTheDaemonItsReserve).
func nodeConnections(fdLimit uint64) int {
	return int(min(1024, fdLimit/8/egressFDs))
}

// egressFDs is what one egress connection may hold of the daemon's
// descriptors: its two sockets, and a splice pipe each way.
const egressFDs = 6

// egressLink is the run's end of its gateway, as the sandbox builds it.
func (n *Node) egressLink() *sandbox.Link {
	return &sandbox.Link{Addr: egress.RunAddr.String(), Peer: egress.GatewayAddr.String(),
		PeerMAC: egress.GatewayMAC.String(), MTU: egress.MTU, Capture: n.cfg.EgressCapture}
}

// proxyEnv puts the gateway's proxy variables in env, in place of any the
// caller set (the capture catches programs that ignore them anyway).
func proxyEnv(env []string) []string {
	ours := egress.ProxyEnv()
	out := make([]string, 0, len(env)+len(ours))
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if !slices.ContainsFunc(ours, func(o string) bool { return strings.HasPrefix(o, k+"=") }) {
			out = append(out, e)
		}
	}
	return append(out, ours...)
}

// gateway starts b's egress gateway on its link when b has none yet (a
// kept sandbox keeps its own); a run without a link gets none. The gateway
// is tied to b's run: it closes once the run's init is reaped.
func (n *Node) gateway(s *Session, b *box) error {
	if b.gw != nil {
		return nil
	}
	link := b.r.TakeLink()
	if link == nil {
		return nil
	}
	if link.Fallback != "" {
		n.log.Warn("egress: the run's connections go through the netstack capture", "why", link.Fallback)
	}
	sb := n.cfg.Conditions().Sandbox()
	if sb == nil {
		// A reload took [sandbox] away since the run was decided.
		link.Close()
		return errors.New("conditions.toml has no [sandbox] table any more")
	}
	ca, err := n.egressCA()
	if err != nil {
		link.Close()
		return err
	}
	gw, err := egress.New(egress.Config{
		Stream: link.Stream, Datagram: link.Datagram, Packet: link.Packet,
		// [sandbox] hosts as it is at each lookup (reloads apply).
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			hosts := ""
			if sb := n.cfg.Conditions().Sandbox(); sb != nil {
				hosts = sb.Hosts()
			}
			return egress.HostsResolver(hosts)(ctx, host)
		},
		Reach: func(a netip.Addr) bool {
			sb := n.cfg.Conditions().Sandbox()
			return sb != nil && sb.MayReachPrivate(a)
		},
		Connections: sb.Connections(),
		Share:       n.egressShare(s, sb.Connections()),
		Audit:       func(e egress.Event) { n.cfg.AuditConnect(s.id, s.view.Context().Atoms(), e) },
		Inspect:     n.inspection(s, ca),
		Log:         n.log,
	})
	if err != nil {
		return err
	}
	b.gw = gw
	b.r.SetNet(gw)
	stack := gw.Stack()
	n.egressStack.Store(&stack)
	return nil
}

// egressShare is s's part of the node's pool, which all its runs share:
// [sandbox] connections as it was at its first policy run, so that one
// session's runs together hold no more than one run may, and the node's
// pool shares its connections fairly among the sessions (egress.Pool).
func (n *Node) egressShare(s *Session, conns int) *egress.Share {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.egress == nil {
		s.egress = n.egressPool.Share(s.owner, conns)
	}
	return s.egress
}

// connectDecider decides s's run's connections with roles, in s's context
// at the moment of each decision.
func (n *Node) connectDecider(s *Session, roles []string) egress.Decider {
	return func(r egress.Request) egress.Verdict {
		args, err := json.Marshal(r.Args())
		if err != nil {
			return egress.Verdict{Decision: "deny", Reasons: []string{"the connection's arguments cannot be encoded"}}
		}
		params, _ := json.Marshal(map[string]any{"roles": roles, "tool": "connect", "args": json.RawMessage(args)})
		req := constraints.DecodeRequest(params)
		set := s.view.Context()
		req.Atoms = &set
		dec := n.cfg.Policy().Decide(&req)
		return egress.Verdict{Decision: dec.Decision.String(), Reasons: dec.Reasons, Context: set.String()}
	}
}

// EgressStatus is status.egress: the network mode runs get under the
// config in force, and the node's open egress connections and bound.
func (n *Node) EgressStatus() map[string]any {
	network := "none"
	if sb := n.cfg.Conditions().Sandbox(); sb != nil {
		network = string(sb.Network())
	}
	stack := ""
	if p := n.egressStack.Load(); p != nil {
		stack = *p
	}
	return map[string]any{"network": network, "connections": n.egressPool.InUse(), "max_connections": n.egressPool.Max(),
		"capture": n.cfg.EgressCapture, "stack": stack}
}
