package egress

import (
	"container/list"
	"sync"
)

// Pool bounds the open connections of every run of a node, shared among
// its sessions max-min fairly. A bound that admits whoever comes first
// lets a few sessions that hold idle connections leave every other
// session none; here, while the pool is full, a new connection of a
// session that holds fewer than the session holding the most (by two or
// more) is admitted by cutting that session's oldest connection. So a
// session can always reach its fair part of the node (the pool over the
// sessions holding connections), whatever the others hold.
type Pool struct {
	mu      sync.Mutex
	max     int
	used    int
	holders map[*Share]struct{} // the shares holding at least one
}

// Share is one session's part of a Pool: the connections of all its runs
// together, at most max of them.
type Share struct {
	p    *Pool
	max  int
	held list.List // of *hold, oldest first; guarded by p.mu
}

// hold is one admitted connection.
type hold struct {
	s     *Share
	el    *list.Element // nil once released or evicted
	evict func()
}

// NewPool makes a pool of max connections.
func NewPool(max int) *Pool {
	return &Pool{max: max, holders: map[*Share]struct{}{}}
}

// Share makes a session's part of p, bounded at max connections.
func (p *Pool) Share(max int) *Share { return &Share{p: p, max: max} }

// InUse is how many connections p holds.
func (p *Pool) InUse() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Max is p's bound.
func (p *Pool) Max() int { return p.max }

// Held is how many connections s holds.
func (s *Share) Held() int {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return s.held.Len()
}

// take admits one connection of s; evict ends it should a session with
// fewer need its slot (called once, without any lock of p's held).
// release gives the slot back; it does nothing after an eviction. false:
// s is at its bound, or the pool is full and s holds its fair part. A
// nil Share admits everything.
func (s *Share) take(evict func()) (release func(), ok bool) {
	if s == nil {
		return func() {}, true
	}
	p := s.p
	p.mu.Lock()
	if s.held.Len() >= s.max {
		p.mu.Unlock()
		return nil, false
	}
	var victim *hold
	if p.used >= p.max {
		if victim = p.victimFor(s); victim == nil {
			p.mu.Unlock()
			return nil, false
		}
		p.drop(victim)
	}
	h := &hold{s: s, evict: evict}
	h.el = s.held.PushBack(h)
	p.used++
	p.holders[s] = struct{}{}
	p.mu.Unlock()
	if victim != nil {
		victim.evict()
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if h.el != nil {
			p.drop(h)
		}
	}, true
}

// victimFor is the oldest connection of the share holding the most, if
// that is at least two more than s holds (one more would only move the
// imbalance to s); nil otherwise. The caller holds p.mu. At most max
// shares hold connections, so the scan is bounded by the pool's size.
func (p *Pool) victimFor(s *Share) *hold {
	var most *Share
	for o := range p.holders {
		if most == nil || o.held.Len() > most.held.Len() {
			most = o
		}
	}
	if most == nil || most.held.Len() < s.held.Len()+2 {
		return nil
	}
	return most.held.Front().Value.(*hold)
}

// drop takes h out of p; the caller holds p.mu.
func (p *Pool) drop(h *hold) {
	h.s.held.Remove(h.el)
	h.el = nil
	p.used--
	if h.s.held.Len() == 0 {
		delete(p.holders, h.s)
	}
}
