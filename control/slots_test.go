package control

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSlotTable: who is admitted, who is refused and which idle connection
// makes room, at given times.
func TestSlotTable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// 16 slots: 2 kept for root and the daemon, 14 for the others, at
	// most 5 each; pressure from 11 of the others (or 12 in all).
	tab := newSlotTable(16, 5, 10*time.Second)
	admit := func(uid uint32, priv bool, now time.Time) (*slot, []*slot, *Error) {
		t.Helper()
		return tab.admit(nil, uid, priv, now)
	}
	var a []*slot
	for i := 0; i < 5; i++ {
		sl, v, err := admit(1000, false, at(time.Duration(i)*time.Second))
		if err != nil || len(v) > 0 {
			t.Fatalf("uid 1000, connection %d: %v %v", i, err, v)
		}
		a = append(a, sl)
	}
	if _, _, err := admit(1000, false, at(time.Minute)); err == nil || err.Code != CodeBusy || !strings.Contains(err.Message, "--max-conns-per-uid") {
		t.Fatalf("over the per-uid cap: %v", err)
	}
	for uid := uint32(1001); uid <= 1002; uid++ {
		for i := 0; i < 4; i++ {
			if _, _, err := admit(uid, false, at(time.Minute)); err != nil {
				t.Fatalf("uid %d: %v", uid, err)
			}
		}
	}
	// 13 others; a fourteenth fills their share.
	if _, _, err := admit(1003, false, at(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Full: uid 1004 (would hold 1) gets in in place of the longest idle
	// connection of uid 1000 (5), idle past the grace...
	a[1].busy = true // ...but never one in the middle of a request.
	sl, v, err := admit(1004, false, at(time.Minute))
	if err != nil || len(v) != 1 || v[0] != a[0] {
		t.Fatalf("newcomer on a full share: %v, victims %v, want a[0]", err, v)
	}
	if sl == nil || tab.byUID[1000] != 4 || tab.others != 14 {
		t.Fatalf("after the swap: uid 1000 holds %d, others %d", tab.byUID[1000], tab.others)
	}
	// uid 1001 (4, would hold 5) may not take from uid 1000 (4).
	if _, _, err := admit(1001, false, at(time.Minute)); err == nil || !strings.Contains(err.Message, "--max-conns ") {
		t.Fatalf("newcomer holding as many as the most: %v", err)
	}
	// Nor may a newcomer take a connection idle for less than the grace.
	if _, _, err := admit(1005, false, at(5*time.Second)); err == nil {
		t.Fatal("a connection idle for less than the grace made room")
	}
	// Root takes the reserve...
	for i := 0; i < 2; i++ {
		if _, v, err := admit(0, true, at(time.Minute)); err != nil || len(v) > 0 {
			t.Fatalf("root, reserved slot %d: %v %v", i, err, v)
		}
	}
	// ...and beyond it, the longest idle connection of the uid holding the
	// most, whatever its idle time.
	if _, v, err := admit(uint32(os.Geteuid()), true, at(2*time.Second)); err != nil || len(v) != 1 || v[0] != a[2] {
		t.Fatalf("the daemon's uid on a full table: %v, victims %v, want a[2]", err, v)
	}
	// Pressure: 16 of 16 taken, the others' 13 of 14. Reaping takes the
	// longest idle of the uid holding the most, past the grace, never a
	// busy one, until 11 in all are left (others: 8).
	got := tab.reap(at(time.Hour))
	if len(got) != 5 || tab.others != 8 {
		t.Fatalf("reaped %d, others now %d; want 5 and 8", len(got), tab.others)
	}
	for _, v := range got {
		if v.busy || v.priv {
			t.Fatalf("reaped a busy or privileged connection: %+v", v)
		}
	}
	if n := tab.byUID; n[1000] != 2 || n[1001] != 2 || n[1002] != 2 || n[1003] != 1 || n[1004] != 1 {
		t.Fatalf("after reaping: %v; want the three biggest cut to 2 each", n)
	}
	if _, busy := tab.all[a[1]]; !busy {
		t.Fatal("the busy connection was reaped")
	}
	if r := tab.reap(at(2 * time.Hour)); len(r) != 0 {
		t.Fatalf("reaped %d with no pressure", len(r))
	}
	// Releasing twice counts once.
	tab.release(a[1])
	tab.release(a[1])
	if tab.byUID[1000] != 1 || tab.others != 7 {
		t.Fatalf("double release: %v, others %d", tab.byUID, tab.others)
	}
}

var dialSeq atomic.Int64

// serveUIDs serves with each connection's uid read from the client's
// address rather than SO_PEERCRED, so that one process can play several
// uids; dial connects as uid. (integration/daemon/slots_test.go checks the same
// with a real other uid.)
func serveUIDs(t *testing.T, opts Options) (s *Server, dial func(uid uint32) *net.UnixConn) {
	t.Helper()
	opts.Group = -1
	opts.Handler = echo
	if opts.Path == "" {
		opts.Path = t.TempDir() + "/run/c.sock"
	}
	s, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.peerUID = func(c *net.UnixConn) (uint32, error) {
		name := c.RemoteAddr().String()
		f := strings.Split(name, "-")
		uid, err := strconv.ParseUint(f[len(f)-2], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("no uid in %q", name)
		}
		return uint32(uid), nil
	}
	done := make(chan struct{})
	go func() { s.Serve(); close(done) }()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return s, func(uid uint32) *net.UnixConn {
		t.Helper()
		laddr := &net.UnixAddr{Name: fmt.Sprintf("@condfs-test-%d-%d-%d", os.Getpid(), uid, dialSeq.Add(1)), Net: "unix"}
		c, err := net.DialUnix("unix", laddr, &net.UnixAddr{Name: s.Addr(), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// echoOn makes one call on c and returns the answer line ("" and the error
// if none came).
func echoOn(c net.Conn) (string, error) {
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":1}}`)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	return bufio.NewReader(c).ReadString('\n')
}

func served(t *testing.T, what string, c net.Conn) {
	t.Helper()
	if got, err := echoOn(c); !strings.Contains(got, `"result"`) {
		t.Fatalf("%s: %q %v", what, got, err)
	}
}

// refusedWith: c got one error line containing each want, then was closed.
func refusedWith(t *testing.T, what string, c net.Conn, want ...string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Fatalf("%s: %q %v, want %q", what, line, err, w)
		}
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatalf("%s: still open after its error line", what)
	}
}

// TestSlotsPerUID: a uid other than root and the daemon's holds at most
// MaxConnsPerUID; one more gets an error line naming the flag, and other
// uids and root are served meanwhile.
func TestSlotsPerUID(t *testing.T) {
	_, dial := serveUIDs(t, Options{MaxConns: 16, MaxConnsPerUID: 2, AllowUIDs: []uint32{1000, 1001}})
	a, b := dial(1000), dial(1000)
	served(t, "uid 1000, first", a)
	served(t, "uid 1000, second", b)
	refusedWith(t, "uid 1000, third", dial(1000), "-32013", "--max-conns-per-uid")
	served(t, "uid 1001", dial(1001))
	served(t, "root", dial(0))
	refusedWith(t, "uid 4242, not admitted", dial(4242), "-32010")
	// A closed connection's place is the uid's again.
	a.Close()
	for deadline := time.Now().Add(5 * time.Second); ; {
		c := dial(1000)
		got, _ := echoOn(c)
		if strings.Contains(got, `"result"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection's place was never freed: %s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	served(t, "uid 1000, second, still", b)
}

// TestSlotsRootServed: other uids fill their whole share; root still gets
// in, on the reserve and then in place of the longest idle connection of
// another uid.
func TestSlotsRootServed(t *testing.T) {
	// 8 slots, 1 kept; the grace is long so that nothing is reaped.
	_, dial := serveUIDs(t, Options{MaxConns: 8, MaxConnsPerUID: 8, IdleGrace: time.Hour, AllowUIDs: []uint32{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007}})
	var others []*net.UnixConn
	for uid := uint32(1000); uid < 1007; uid++ {
		c := dial(uid)
		served(t, fmt.Sprint("uid ", uid), c)
		others = append(others, c)
	}
	refusedWith(t, "uid 1007, the others' share full", dial(1007), "-32013", "--max-conns")
	// Each connection is idle once its goroutine is past its answer,
	// which a client that has read the answer may outrun: let them get
	// there (a busy one is never a victim, and then another uid's was).
	time.Sleep(50 * time.Millisecond)
	root := dial(0)
	served(t, "root, on the reserve", root)
	served(t, "root, once every slot is taken", dial(0))
	// The longest idle of the others, uid 1000's, made room.
	if got, err := echoOn(others[0]); err == nil {
		t.Fatalf("uid 1000's idle connection was not closed: %q", got)
	}
	for i, c := range others[1:] {
		served(t, fmt.Sprint("uid ", 1001+i, " after root got in"), c)
	}
	served(t, "root's first connection", root)
}

// TestSlotsIdleReaped: while connections are short, the idle connections of
// the uid holding the most, half-written lines included, are closed after
// the grace until the pressure is off; root's never are.
func TestSlotsIdleReaped(t *testing.T) {
	// 8 slots, 7 for the others: pressure from 6 of theirs, or 6 in all.
	_, dial := serveUIDs(t, Options{MaxConns: 8, MaxConnsPerUID: 8, IdleGrace: 50 * time.Millisecond, AllowUIDs: []uint32{1000, 1001}})
	root := dial(0)
	served(t, "root", root)
	var halves []*net.UnixConn
	for i := 0; i < 2; i++ {
		c := dial(1000)
		fmt.Fprint(c, `{"jsonrpc":"2.0","id":1,"meth`)
		halves = append(halves, c)
	}
	var idle []*net.UnixConn
	for _, uid := range []uint32{1000, 1000, 1001} {
		c := dial(uid)
		served(t, fmt.Sprint("uid ", uid), c)
		idle = append(idle, c)
	}
	// 6 in all: pressure. uid 1000 holds the most; its two half lines are
	// its longest idle; one closed leaves 5, off the pressure.
	half := halves[0]
	half.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(half).ReadString('\n'); err == nil || got != "" {
		t.Fatalf("a half line under pressure: %q %v, want closed without an answer", got, err)
	}
	served(t, "root, idle past the grace", root)
	for i, c := range idle {
		served(t, fmt.Sprint("idle connection ", i), c)
	}
	// The other half line is left: it finishes its request.
	fmt.Fprintln(halves[1], `od":"echo"}`)
	halves[1].SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(halves[1]).ReadString('\n'); !strings.Contains(got, `"result"`) {
		t.Fatalf("the second half line, below the pressure: %q %v", got, err)
	}
}

// TestRefusalsLogged: a flood of refused connections is logged at most
// once a second per uid, each line counting those left out.
func TestRefusalsLogged(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	_, dial := serveUIDs(t, Options{Logger: logger})
	const n = 50
	for i := 0; i < n; i++ {
		refusedWith(t, "uid 4242", dial(4242), "-32010")
	}
	mu.Lock()
	lines := strings.Count(buf.String(), "uid not admitted")
	mu.Unlock()
	if lines == 0 || lines >= n {
		t.Fatalf("%d refusals logged in %d lines; want at most one a second", n, lines)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
