package egress

import "testing"

// TestPoolFair: sessions that fill the node never leave another session
// none; a newcomer takes the oldest connection of the session holding the
// most, until it holds its fair part, and no further.
func TestPoolFair(t *testing.T) {
	p := NewPool(8)
	hog, other, late := p.Share(1, 8), p.Share(2, 8), p.Share(3, 8)
	evicted := map[int]int{} // hog's connection number → times evicted
	var hogRelease []func()
	for i := range 6 {
		rel, ok := hog.take(func() { evicted[i]++ })
		if !ok {
			t.Fatalf("hog's connection %d refused in a pool with room", i)
		}
		hogRelease = append(hogRelease, rel)
	}
	for i := range 2 {
		if _, ok := other.take(func() { t.Errorf("other's connection %d evicted", i) }); !ok {
			t.Fatalf("other's connection %d refused in a pool with room", i)
		}
	}
	if p.InUse() != 8 {
		t.Fatalf("in use %d, want 8", p.InUse())
	}
	// The pool is full (hog 6, other 2): late takes hog's oldest while hog
	// holds two more than late, and ends at 3, 2, 3.
	admitted := 0
	for range 8 {
		if _, ok := late.take(func() {}); ok {
			admitted++
		}
	}
	if admitted != 3 || hog.Held() != 3 || late.Held() != 3 || other.Held() != 2 || p.InUse() != 8 {
		t.Fatalf("late admitted %d; held hog %d, other %d, late %d, in use %d; want 3; 3, 2, 3, 8",
			admitted, hog.Held(), other.Held(), late.Held(), p.InUse())
	}
	// The oldest of hog's went, each once.
	for i := range 6 {
		if want := map[bool]int{true: 1, false: 0}[i < 3]; evicted[i] != want {
			t.Errorf("hog's connection %d evicted %d times, want %d", i, evicted[i], want)
		}
	}
	// Releasing an evicted connection gives nothing back twice.
	for _, rel := range hogRelease {
		rel()
	}
	if p.InUse() != 5 || hog.Held() != 0 {
		t.Fatalf("after hog released all: in use %d, hog holds %d; want 5, 0", p.InUse(), hog.Held())
	}
}

// TestPoolShareBound: a share never holds more than its own bound, even
// with room in the pool, and a pool with room never evicts.
func TestPoolShareBound(t *testing.T) {
	p := NewPool(10)
	s := p.Share(1, 2)
	for i := range 2 {
		if _, ok := s.take(func() { t.Error("evicted with room in the pool") }); !ok {
			t.Fatalf("connection %d refused", i)
		}
	}
	if _, ok := s.take(func() {}); ok {
		t.Fatal("a third connection admitted over the share's bound of 2")
	}
	var nilShare *Share
	if rel, ok := nilShare.take(nil); !ok {
		t.Fatal("a nil share refused")
	} else {
		rel()
	}
}

// TestPoolNoThrash: two sessions one apart never take from each other.
func TestPoolNoThrash(t *testing.T) {
	p := NewPool(3)
	a, b := p.Share(1, 3), p.Share(2, 3)
	a.take(func() { t.Error("a evicted") })
	a.take(func() { t.Error("a evicted") })
	b.take(func() { t.Error("b evicted") })
	if _, ok := b.take(func() {}); ok {
		t.Fatalf("b (1) took from a (2): held a %d, b %d", a.Held(), b.Held())
	}
}

// TestPoolOwnersFair: an owner opening many sessions takes no more than
// its fair part of the node from another owner's single session
// (TestEgressNodePoolFairAmongOneUidsSessions), and its own sessions share its part.
func TestPoolOwnersFair(t *testing.T) {
	p := NewPool(12)
	victim := p.Share(1000, 12)
	for i := range 6 {
		if _, ok := victim.take(func() {}); !ok {
			t.Fatalf("victim's connection %d refused in a pool with room", i)
		}
	}
	var sybils []*Share
	for range 8 {
		s := p.Share(65534, 12)
		sybils = append(sybils, s)
		for range 12 {
			s.take(func() {})
		}
	}
	if victim.Held() != 6 || p.InUse() != 12 {
		t.Fatalf("victim holds %d (want 6, its owner's half), in use %d", victim.Held(), p.InUse())
	}
	// Within the sybil owner's half, its sessions are one apart at most.
	lo, hi := 12, 0
	total := 0
	for _, s := range sybils {
		lo, hi = min(lo, s.Held()), max(hi, s.Held())
		total += s.Held()
	}
	if total != 6 || hi-lo > 1 {
		t.Fatalf("the sybil owner's sessions hold %d in all, between %d and %d each; want 6, one apart", total, lo, hi)
	}
	// A session of the same owner as another takes from its own owner's
	// largest, not from the victim.
	p2 := NewPool(4)
	a, b, c := p2.Share(1, 4), p2.Share(1, 4), p2.Share(2, 4)
	for range 3 {
		a.take(func() {})
	}
	c.take(func() { t.Error("the other owner's connection cut") })
	if _, ok := b.take(func() {}); !ok || a.Held() != 2 || b.Held() != 1 || c.Held() != 1 {
		t.Fatalf("b admitted %v; held a %d, b %d, c %d; want 2, 1, 1", ok, a.Held(), b.Held(), c.Held())
	}
}
