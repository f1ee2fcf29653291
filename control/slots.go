package control

import (
	"encoding/json"
	"net"
	"slices"
	"time"
)

// Connection slots. The socket serves at most MaxConns connections at once.
// Root and the daemon's own uid are privileged: a share of the slots
// (reserved(MaxConns)) is theirs alone, and when every slot is taken one
// of them still gets in by closing the longest idle connection of the uid
// holding the most. Every other admitted uid holds at most MaxConnsPerUID,
// and together they hold at most MaxConns minus the reserve.
//
// Idle means no request in progress: a connection waiting for its next
// line, or dribbling half of one, is idle from its last answer (or from
// being accepted). When slots run short (pressure: three quarters of the
// whole, or of the other uids' share, taken), connections of other uids
// idle longer than IdleGrace are closed, the uid holding the most first,
// until the pressure is off; a newcomer finding the other uids' share full
// is admitted in place of such a connection of a uid holding at least two
// more than it would. A connection is never closed in the middle of a
// request; one closed early is closed without a word, as an idle timeout
// closes it, and a client reconnects. Root's and the daemon's connections
// are never closed early.
//
// Peer credentials are read in the accept loop, before a connection takes
// a slot or a goroutine: a refused connection gets its error line there,
// with a short write deadline, and is closed.

// refuseTimeout bounds the write of a refusal line from the accept loop. A
// fresh Unix stream connection takes a line at once; the bound keeps a
// peer from ever stalling the loop.
const refuseTimeout = 100 * time.Millisecond

// reserved is how many of max slots only root and the daemon's uid may
// take: an eighth, at least one.
func reserved(n int) int { return max(1, n/8) }

// defaultPerUID is --max-conns-per-uid's default: an eighth of max, at
// least one.
func defaultPerUID(n int) int { return max(1, n/8) }

type slot struct {
	c    *net.UnixConn
	uid  uint32
	priv bool
	// Guarded by Server.mu.
	busy      bool      // a request is being handled or answered
	idleSince time.Time // accepted, or its last answer sent
	gone      bool      // released: finished, or closed early
}

// slotTable counts the connections served; guarded by Server.mu.
type slotTable struct {
	max, perUID, othersMax int
	grace                  time.Duration
	all                    map[*slot]struct{}
	byUID                  map[uint32]int // other uids only
	others                 int
}

func newSlotTable(n, perUID int, grace time.Duration) slotTable {
	return slotTable{
		max: n, perUID: perUID, othersMax: n - reserved(n), grace: grace,
		all: map[*slot]struct{}{}, byUID: map[uint32]int{},
	}
}

// admit gives c a slot, or says why not. victims are connections it took
// out of the count to make room; the caller closes them.
func (t *slotTable) admit(c *net.UnixConn, uid uint32, priv bool, now time.Time) (sl *slot, victims []*slot, refusal *Error) {
	if priv {
		if len(t.all) >= t.max {
			v := t.victim(now, 0, 0)
			if v == nil {
				return nil, nil, Errorf(CodeBusy, "the daemon serves %d connections already (--max-conns); close one and retry", t.max)
			}
			t.release(v)
			victims = append(victims, v)
		}
	} else {
		if n := t.byUID[uid]; n >= t.perUID {
			return nil, nil, Errorf(CodeBusy, "uid %d has %d control connections open, the most a uid other than root and the daemon's may hold (--max-conns-per-uid); close one and retry", uid, n)
		}
		if t.others >= t.othersMax || len(t.all) >= t.max {
			// Only in place of a connection idle past the grace, of a
			// uid that holds at least two more than this one would.
			v := t.victim(now, t.grace, t.byUID[uid]+1)
			if v == nil {
				return nil, nil, Errorf(CodeBusy, "uids other than root and the daemon's hold %d control connections, all they may (--max-conns %d, of which %d are kept for root and the daemon's uid); close one and retry", t.others, t.max, t.max-t.othersMax)
			}
			t.release(v)
			victims = append(victims, v)
		}
	}
	sl = &slot{c: c, uid: uid, priv: priv, idleSince: now}
	t.all[sl] = struct{}{}
	if !priv {
		t.byUID[uid]++
		t.others++
	}
	return sl, victims, nil
}

// release takes sl out of the count; again is a no-op.
func (t *slotTable) release(sl *slot) {
	if sl.gone {
		return
	}
	sl.gone = true
	delete(t.all, sl)
	if !sl.priv {
		t.others--
		if t.byUID[sl.uid]--; t.byUID[sl.uid] == 0 {
			delete(t.byUID, sl.uid)
		}
	}
}

// victim picks a connection of another uid, idle at least minIdle, whose
// uid holds more than above connections: of the uid holding the most, the
// longest idle. nil if there is none.
func (t *slotTable) victim(now time.Time, minIdle time.Duration, above int) *slot {
	var best *slot
	for sl := range t.all {
		if sl.priv || sl.busy || now.Sub(sl.idleSince) < minIdle || t.byUID[sl.uid] <= above {
			continue
		}
		if best == nil || t.byUID[sl.uid] > t.byUID[best.uid] ||
			(t.byUID[sl.uid] == t.byUID[best.uid] && sl.idleSince.Before(best.idleSince)) {
			best = sl
		}
	}
	return best
}

func (t *slotTable) pressed() bool {
	return t.others*4 >= t.othersMax*3 || len(t.all)*4 >= t.max*3
}

// reap takes connections idle past the grace out of the count while slots
// are short; the caller closes them.
func (t *slotTable) reap(now time.Time) []*slot {
	var out []*slot
	for t.pressed() {
		v := t.victim(now, t.grace, 0)
		if v == nil {
			break
		}
		t.release(v)
		out = append(out, v)
	}
	return out
}

// reapLoop closes idle connections of other uids while slots are short,
// until Close.
func (s *Server) reapLoop() {
	defer s.wg.Done()
	tick := time.NewTicker(max(s.opts.IdleGrace/2, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-tick.C:
			s.mu.Lock()
			victims := s.slots.reap(now)
			s.mu.Unlock()
			s.closeEarly(victims, "idle while connections are short")
		}
	}
}

func (s *Server) closeEarly(victims []*slot, why string) {
	for _, v := range victims {
		s.opts.Logger.Info("control connection closed early: "+why, "uid", v.uid, "idle", time.Since(v.idleSince).Round(time.Millisecond).String())
		v.c.Close()
	}
}

// begin marks a request in progress on sl; false if sl was closed early
// (the request is then not served).
func (s *Server) begin(sl *slot) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.gone {
		return false
	}
	sl.busy = true
	return true
}

// end marks sl idle again, since when its answer was sent.
func (s *Server) end(sl *slot, since time.Time) {
	s.mu.Lock()
	sl.busy, sl.idleSince = false, since
	s.mu.Unlock()
}

// admit checks c's peer credentials and gives it a slot and a goroutine,
// or refuses it, without waiting on the peer.
func (s *Server) admit(c *net.UnixConn) {
	uid, err := s.peerUID(c)
	if err != nil {
		s.logRefusal(^uint32(0), "control connection refused: no peer credentials", "err", err)
		s.refuse(c, Errorf(CodeRefused, "the daemon cannot read this connection's peer credentials"))
		return
	}
	priv := uid == 0 || uid == s.self
	if !priv && !slices.Contains(s.opts.AllowUIDs, uid) {
		s.logRefusal(uid, "control connection refused: uid not admitted")
		s.refuse(c, Errorf(CodeRefused, "uid %d may not use this socket; ask the operator to add --allow-uid %d", uid, uid))
		return
	}
	s.mu.Lock()
	select {
	case <-s.done: // Close has closed every connection it knew
		s.mu.Unlock()
		c.Close()
		return
	default:
	}
	sl, victims, refusal := s.slots.admit(c, uid, priv, time.Now())
	if refusal == nil {
		s.wg.Add(1) // under mu: before Close can Wait
	}
	s.mu.Unlock()
	s.closeEarly(victims, "idle, to make room")
	if refusal != nil {
		s.logRefusal(uid, "control connection refused: no slot", "reason", refusal.Message)
		s.refuse(c, refusal)
		return
	}
	if s.opts.OnConn != nil {
		s.opts.OnConn()
	}
	go func() {
		defer s.wg.Done()
		s.serveConn(sl)
		s.mu.Lock()
		s.slots.release(sl)
		s.mu.Unlock()
	}()
}

// refuse answers one error line and closes the connection, from the
// accept loop: the write is bounded by refuseTimeout.
func (s *Server) refuse(c net.Conn, e *Error) {
	defer c.Close()
	s.onError(e.Code)
	b, _ := json.Marshal(response{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: e})
	c.SetWriteDeadline(time.Now().Add(refuseTimeout))
	c.Write(append(b, '\n'))
}

type refusalLog struct {
	last    time.Time
	skipped int
}

// logRefusal logs a refused connection at most once a second per uid (the
// next line counts those left out): a flood of connections must not
// become a flood of the log. The socket-error metric counts every one.
func (s *Server) logRefusal(uid uint32, msg string, args ...any) {
	now := time.Now()
	s.logMu.Lock()
	r := s.refusals[uid]
	if !r.last.IsZero() && now.Sub(r.last) < time.Second {
		r.skipped++
		s.refusals[uid] = r
		s.logMu.Unlock()
		return
	}
	s.refusals[uid] = refusalLog{last: now}
	if len(s.refusals) > 1024 {
		for u, l := range s.refusals {
			if now.Sub(l.last) >= time.Second {
				delete(s.refusals, u)
			}
		}
	}
	s.logMu.Unlock()
	s.opts.Logger.Warn(msg, append(args, "uid", uid, "suppressed", r.skipped)...)
}
