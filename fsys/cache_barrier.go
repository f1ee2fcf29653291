package fsys

import "sync"

// barrier lets a reload wait for a view's listings in flight, without
// holding up listings that begin meanwhile. A READDIRPLUS decides its
// entries, then go-fuse adds their nodes to the tree and the kernel links
// them with the epoch current when the answer arrives: a reload that bumps
// the epoch must first let every listing decided with the old rules get
// its nodes into the tree, and then drop those whose decision changed.
//
// Each listing enters in the barrier's current round and leaves when its
// answer is built; wait closes the round and waits for the listings that
// entered in it or before. A listing that enters after wait began decides
// with the new rules and is not waited for, so a reload never stalls a
// listing, and a slow listing stalls only its own view's reload (an
// RWMutex held by every listing let a waiting writer stall the listings of
// every session behind the slowest one in flight).
type barrier struct {
	mu      sync.Mutex
	round   uint64
	in      map[uint64]int // listings in flight by the round they entered in
	waiting *sync.Cond     // signalled when a listing leaves a closed round
}

// enter records a listing beginning; the listing calls leave with what it
// returns when it has its answer.
func (b *barrier) enter() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.in == nil {
		b.in = map[uint64]int{}
	}
	b.in[b.round]++
	return b.round
}

func (b *barrier) leave(round uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.in[round]--; b.in[round] == 0 {
		delete(b.in, round)
	}
	if round < b.round && b.waiting != nil {
		b.waiting.Broadcast()
	}
}

// wait returns once every listing that entered before it was called has
// left.
func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed := b.round
	b.round++
	if b.waiting == nil {
		b.waiting = sync.NewCond(&b.mu)
	}
	for b.inFlightUpTo(closed) {
		b.waiting.Wait()
	}
}

func (b *barrier) inFlightUpTo(round uint64) bool {
	for r := range b.in {
		if r <= round {
			return true
		}
	}
	return false
}
