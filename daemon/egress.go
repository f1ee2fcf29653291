package daemon

// The egress gateway of runs whose [sandbox] network is "policy": every
// connection and plain-HTTP request is the policy's tool `connect`, decided
// in the session's context as it is at that moment, audited, counted, and
// decided again on every context switch and reload (allowRuns).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

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
// TestAttackEgressMemory), which no run's memory limit counts: the node's
// total is bounded here (about 700 MB at most). Four sessions holding 256
// each ran a daemon with 2,048 descriptors out of them, and every session
// with it (TestAtk9CEgressEatsReserve).
func nodeConnections(fdLimit uint64) int {
	return int(min(1024, fdLimit/8/egressFDs))
}

// egressFDs is what one egress connection may hold of the daemon's
// descriptors: its two sockets, and a splice pipe each way.
const egressFDs = 6

// egressLink is the run's end of its gateway, as the sandbox builds it.
func (d *Daemon) egressLink() *sandbox.Link {
	return &sandbox.Link{Addr: egress.RunAddr.String(), Peer: egress.GatewayAddr.String(),
		PeerMAC: egress.GatewayMAC.String(), MTU: egress.MTU, Capture: d.cfg.EgressCapture}
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

// gateway is r's egress gateway, started on its link when r has none yet
// (a kept sandbox keeps its own); nil for a run without one.
func (d *Daemon) gateway(s *session, r *sandbox.Run) (*egress.Gateway, error) {
	if gw, ok := r.Net().(*egress.Gateway); ok {
		return gw, nil
	}
	link := r.TakeLink()
	if link == nil {
		return nil, nil
	}
	if link.Fallback != "" {
		d.log.Warn("egress: the run's connections go through the netstack capture", "why", link.Fallback)
	}
	sb := d.conditions.Load().Sandbox()
	if sb == nil {
		// A reload took [sandbox] away since the run was decided.
		link.Close()
		return nil, errors.New("conditions.toml has no [sandbox] table any more")
	}
	ca, err := d.egressCA()
	if err != nil {
		link.Close()
		return nil, err
	}
	gw, err := egress.New(egress.Config{
		Stream: link.Stream, Datagram: link.Datagram, Packet: link.Packet,
		// [sandbox] hosts as it is at each lookup (reloads apply).
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			hosts := ""
			if sb := d.conditions.Load().Sandbox(); sb != nil {
				hosts = sb.Hosts()
			}
			return egress.HostsResolver(hosts)(ctx, host)
		},
		Reach: func(a netip.Addr) bool {
			sb := d.conditions.Load().Sandbox()
			return sb != nil && sb.MayReachPrivate(a)
		},
		Connections: sb.Connections(),
		Share:       d.egressShare(s, sb.Connections()),
		Audit:       func(e egress.Event) { d.auditConnect(s, e) },
		Inspect:     d.inspection(s, ca),
		Log:         d.log,
	})
	if err != nil {
		return nil, err
	}
	r.SetNet(gw)
	stack := gw.Stack()
	d.egressStack.Store(&stack)
	return gw, nil
}

// egressShare is s's part of the node's pool, which all its runs share:
// [sandbox] connections as it was at its first policy run, so that one
// session's runs together hold no more than one run may, and the node's
// pool shares its connections fairly among the sessions (egress.Pool).
func (d *Daemon) egressShare(s *session, n int) *egress.Share {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.egress == nil {
		s.egress = d.egressPool.Share(s.owner, n)
	}
	return s.egress
}

// connectDecider decides s's run's connections with roles, in s's context
// at the moment of each decision.
func (d *Daemon) connectDecider(s *session, roles []string) egress.Decider {
	return func(r egress.Request) egress.Verdict {
		args, err := json.Marshal(r.Args())
		if err != nil {
			return egress.Verdict{Decision: "deny", Reasons: []string{"the connection's arguments cannot be encoded"}}
		}
		params, _ := json.Marshal(map[string]any{"roles": roles, "tool": "connect", "args": json.RawMessage(args)})
		req := constraints.DecodeRequest(params)
		set := s.view.Context()
		req.Atoms = &set
		dec := d.policy.Load().Decide(&req)
		return egress.Verdict{Decision: dec.Decision.String(), Reasons: dec.Reasons, Context: set.String()}
	}
}

// auditConnect writes one decision of s's gateway and counts it.
func (d *Daemon) auditConnect(s *session, e egress.Event) {
	outcome := e.Decision
	switch {
	case strings.HasPrefix(e.Refused, "cut:"):
		outcome = "cut"
	case e.Refused != "":
		outcome = "refused"
	}
	d.metrics.Egress(e.Protocol, outcome)
	atoms := s.view.Context().Atoms() // one read: the key and the record agree
	var suppressed, unlisted int
	var lim *denialLimiter
	var key denialKey
	if outcome != "cut" {
		// A run that retries a connection or a request in a loop must
		// not fill the disk (audit.go), allowed or refused; a cut is
		// written every time.
		// Everything the record shows is in the key: a request that
		// carried a secret, or was made in another context, is never
		// counted in the record of one that did not.
		key = denialKey{"connect", keyOf(e.Protocol, e.Host, fmt.Sprint(e.Port), e.Method, e.Path, e.Addr.String(),
			keyOf(e.Secrets...), keyOf(atoms...)),
			keyOf(append([]string{e.Decision, e.Refused}, e.Reasons...)...)}
		lim = &d.denials
		if outcome == "allow" {
			lim = &d.allowed
		}
		var write bool
		if write, suppressed, unlisted = lim.admit(s.id, key, time.Now()); !write {
			return
		}
	}
	attrs := []any{"kind", "connect", "session", s.id, "atoms", atoms,
		"host", e.Host, "port", e.Port, "protocol", e.Protocol}
	if e.Protocol == "http" || e.Method != "" {
		attrs = append(attrs, "method", clip(e.Method), "path", clip(e.Path))
	}
	if len(e.Secrets) > 0 {
		attrs = append(attrs, "secrets", e.Secrets)
	}
	if e.Addr.IsValid() {
		attrs = append(attrs, "addr", e.Addr.String())
	}
	attrs = append(attrs, "decision", e.Decision, "reasons", nonNil(clipAll(e.Reasons)))
	if e.Refused != "" {
		attrs = append(attrs, "refused", e.Refused)
	}
	if lim != nil {
		lim.keep(s.id, key, "connect", attrs)
	}
	d.audit.Info("connect", counts(attrs, suppressed, unlisted)...)
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// recheckEgress decides every open connection of a's gateway again.
func recheckEgress(a *activeRun) {
	if gw, ok := a.r.Net().(*egress.Gateway); ok {
		gw.Recheck()
	}
}

// egressStatus is status.egress: the network mode runs get under the
// config in force, and the node's open egress connections and bound.
func (d *Daemon) egressStatus() map[string]any {
	network := "none"
	if sb := d.conditions.Load().Sandbox(); sb != nil {
		network = string(sb.Network())
	}
	stack := ""
	if p := d.egressStack.Load(); p != nil {
		stack = *p
	}
	return map[string]any{"network": network, "connections": d.egressPool.InUse(), "max_connections": d.egressPool.Max(),
		"capture": d.cfg.EgressCapture, "stack": stack}
}
