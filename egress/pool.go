package egress

import (
	"container/list"
	"sync"
)

// Pool bounds the open connections of every run of a node, shared
// max-min fairly among the owners (uids) of the sessions, then among each
// owner's sessions. A bound that admits whoever comes first lets a few
// sessions that hold idle connections leave every other session none;
// here, while the pool is full, a new connection of an owner that holds
// fewer than the owner holding the most (by two or more) is admitted by
// cutting the oldest connection of that owner's largest session, and one
// of a session that holds fewer than its owner's largest (by two or more),
// by cutting that session's oldest. So an owner can always reach its fair
// part of the node, however many sessions another opens
// (TestEgressNodePoolFairAmongOneUidsSessions), and a session its fair part of its
// owner's.
type Pool struct {
	mu     sync.Mutex
	max    int
	used   int
	owners map[uint32]*owner // the owners holding at least one
}

// owner is what one uid's sessions hold together.
type owner struct {
	held    int
	holders map[*Share]struct{} // its shares holding at least one
}

// Share is one session's part of a Pool: the connections of all its runs
// together, at most max of them.
type Share struct {
	p     *Pool
	owner uint32
	max   int
	held  list.List // of *hold, oldest first; guarded by p.mu
}

// hold is one admitted connection.
type hold struct {
	s     *Share
	el    *list.Element // nil once released or evicted
	evict func()
}

// NewPool makes a pool of max connections.
func NewPool(max int) *Pool {
	return &Pool{max: max, owners: map[uint32]*owner{}}
}

// Share makes the part of p of a session of uid, bounded at max
// connections.
func (p *Pool) Share(uid uint32, max int) *Share { return &Share{p: p, owner: uid, max: max} }

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
	o := p.owners[s.owner]
	if o == nil {
		o = &owner{holders: map[*Share]struct{}{}}
		p.owners[s.owner] = o
	}
	o.held++
	o.holders[s] = struct{}{}
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

// victimFor is the connection to cut for one more of s: the oldest of the
// largest share of the owner holding the most, if that owner holds at least
// two more than s's (one more would only move the imbalance); else the
// oldest of the largest share of s's owner, if that one holds at least two
// more than s; else nil. The caller holds p.mu. At most max owners and
// shares hold connections, so the scans are bounded by the pool's size.
func (p *Pool) victimFor(s *Share) *hold {
	mine := p.owners[s.owner]
	ownHeld := 0
	if mine != nil {
		ownHeld = mine.held
	}
	var top *owner
	for _, o := range p.owners {
		if top == nil || o.held > top.held {
			top = o
		}
	}
	if top != nil && top != mine && top.held >= ownHeld+2 {
		return largest(top).held.Front().Value.(*hold)
	}
	if mine == nil {
		return nil
	}
	if l := largest(mine); l.held.Len() >= s.held.Len()+2 {
		return l.held.Front().Value.(*hold)
	}
	return nil
}

// largest is o's share holding the most.
func largest(o *owner) *Share {
	var most *Share
	for sh := range o.holders {
		if most == nil || sh.held.Len() > most.held.Len() {
			most = sh
		}
	}
	return most
}

// drop takes h out of p; the caller holds p.mu.
func (p *Pool) drop(h *hold) {
	h.s.held.Remove(h.el)
	h.el = nil
	p.used--
	o := p.owners[h.s.owner]
	o.held--
	if h.s.held.Len() == 0 {
		delete(o.holders, h.s)
	}
	if o.held == 0 {
		delete(p.owners, h.s.owner)
	}
}
