package egress

import "testing"

// TestPoolFair: sessions that fill the node never leave another session
// none; a newcomer takes the oldest connection of the session holding the
// most, until it holds its fair part, and no further.
func TestPoolFair(t *testing.T) {
	p := NewPool(8)
	hog, other, late := p.Share(8), p.Share(8), p.Share(8)
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
	s := p.Share(2)
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
	a, b := p.Share(3), p.Share(3)
	a.take(func() { t.Error("a evicted") })
	a.take(func() { t.Error("a evicted") })
	b.take(func() { t.Error("b evicted") })
	if _, ok := b.take(func() {}); ok {
		t.Fatalf("b (1) took from a (2): held a %d, b %d", a.Held(), b.Held())
	}
}
