package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/control"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const policy = `version: 1
roles:
  default:
    consts: {max_refund: 500}
    tools:
      refund:
        mode: approval_required
        constraints:
          - args.amount <= args.order_total
          - args.amount <= consts.max_refund or role == "billing"
`

// newDaemon starts a daemon without sessions (no FUSE needed) on a temp
// home, serving its socket.
func newDaemon(t testing.TB, conditions, pol string) (*Daemon, string) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"config", "memories", "workspace", "blocks"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	if conditions != "" {
		os.WriteFile(filepath.Join(root, "config/conditions.toml"), []byte(conditions), 0o644)
	}
	if pol != "" {
		os.WriteFile(filepath.Join(root, "config/policy.yaml"), []byte(pol), 0o644)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := New(Config{
		Conditions: filepath.Join(root, "config/conditions.toml"), Policy: filepath.Join(root, "config/policy.yaml"),
		BlocksDir: filepath.Join(root, "blocks"), Memories: filepath.Join(root, "memories"), Workspace: filepath.Join(root, "workspace"),
		Socket: filepath.Join(root, "run/condfs.sock"), SocketGroup: -1, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { d.Serve(); close(done) }()
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		<-done
	})
	return d, root
}

func TestStartFailsOnBrokenConfig(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "config"), 0o755)
	os.WriteFile(filepath.Join(root, "config/policy.yaml"), []byte("tools:\n  t: {mode: maybe}\n"), 0o644)
	_, err := New(Config{Conditions: filepath.Join(root, "config/c.toml"), Policy: filepath.Join(root, "config/policy.yaml"),
		Memories: root, Workspace: root, Socket: filepath.Join(root, "run/s"), SocketGroup: -1})
	if err == nil || !strings.Contains(err.Error(), "policy.yaml:2:") {
		t.Fatalf("broken policy at start: %v", err)
	}
}

// TestPolicyReload: a real fsnotify event reloads the policy; a broken
// edit keeps the last good one and reports the error.
func TestPolicyReload(t *testing.T) {
	d, root := newDaemon(t, "", "tools:\n  t: {mode: deny}\n")
	c, err := control.Dial(d.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	decide := func() string {
		var res struct{ Decision string }
		if err := c.Call("tool.decide", map[string]any{"tool": "t", "args": map[string]any{}}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Decision
	}
	if decide() != "deny" {
		t.Fatal("initial policy")
	}
	p := filepath.Join(root, "config/policy.yaml")
	write := func(text string) {
		tmp := p + ".tmp"
		os.WriteFile(tmp, []byte(text), 0o644)
		os.Rename(tmp, p)
	}
	waitFor := func(cond func() bool) {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out; status %+v", d.configStatus())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	write("tools:\n  t: {mode: allow}\n")
	waitFor(func() bool { return decide() == "allow" })
	if st := d.policy.status(); st.Generation != 2 || st.Error != nil {
		t.Fatalf("status after a good edit: %+v", st)
	}
	write("tools:\n  t: {mode: allow, contraints: []}\n")
	waitFor(func() bool { return d.policy.status().Error != nil })
	if decide() != "allow" || d.policy.status().Generation != 2 {
		t.Fatal("a broken edit changed the policy in force")
	}
	var st map[string]FileStatus
	if err := c.Call("config.reload", map[string]any{}, &st); err != nil {
		t.Fatal(err)
	}
	if st["policy"].Error == nil || !strings.Contains(*st["policy"].Error, "contraints") {
		t.Fatalf("config.reload status: %+v", st)
	}
}

// BenchmarkToolDecide: tool.decide over a persistent connection. Compare
// with control.BenchmarkEcho (the same socket, a bare echo) in the same
// run: goal ≤ 1.5×.
func BenchmarkToolDecide(b *testing.B) {
	d, _ := newDaemon(b, "", policy)
	c, err := control.Dial(d.cfg.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	params := map[string]any{"tool": "refund", "args": map[string]any{"amount": 100, "order_total": 200}}
	var out struct{ Decision string }
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Call("tool.decide", params, &out); err != nil || out.Decision != "approval_required" {
			b.Fatal(out, err)
		}
	}
}

// BenchmarkEchoBaseline runs the bare echo in this package too, so that
// one `go test -bench` run gives both sides of the ratio.
func BenchmarkEchoBaseline(b *testing.B) {
	path := filepath.Join(b.TempDir(), "run", "e.sock")
	s, err := control.Listen(control.Options{Path: path, Group: -1, Handler: func(_ context.Context, _ string, p json.RawMessage) (any, *control.Error) {
		return p, nil
	}})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Serve(); close(done) }()
	defer func() { s.Close(); <-done }()
	c, err := control.Dial(path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	params := map[string]any{"tool": "refund", "args": map[string]any{"amount": 100, "order_total": 200}}
	var out json.RawMessage
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Call("echo", params, &out); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDenialRateLimit: identical denials are written once a window, and the
// next record says how many were left out; other denials are not held up.
func TestDenialRateLimit(t *testing.T) {
	var l denialLimiter
	l.init()
	k := denialKey{"memories", "/private/x", "lookup"}
	now := time.Unix(1000, 0)
	if w, _, _ := l.admit("s", k, now); !w {
		t.Fatal("the first denial was not written")
	}
	for i := 0; i < 10000; i++ {
		if w, _, _ := l.admit("s", k, now.Add(time.Millisecond)); w {
			t.Fatal("an identical denial within the window was written")
		}
	}
	if w, _, _ := l.admit("s", denialKey{"memories", "/private/y", "lookup"}, now); !w {
		t.Fatal("another path's denial was held up")
	}
	w, suppressed, _ := l.admit("s", k, now.Add(2*denialWindow))
	if !w || suppressed != 10000 {
		t.Fatalf("after the window: write %v, suppressed %d, want 10000", w, suppressed)
	}
	// A flood of distinct paths keeps memory bounded.
	for i := 0; i < 3*denialKeys; i++ {
		l.admit("s", denialKey{"memories", fmt.Sprintf("/p/%d", i), "lookup"}, now.Add(3*denialWindow))
	}
	if n := len(l.sessions["s"].seen); n > denialKeys {
		t.Fatalf("%d denials remembered, limit %d", n, denialKeys)
	}
	l.forget("s")
	if len(l.sessions) != 0 {
		t.Fatal("a closed session's denials are still remembered")
	}
}

// TestDenialFloodOfOneSessionHidesNoOtherSessions: one session's flood of
// distinct denials neither keeps another session's denials from the audit
// log nor drops its own uncounted: the limiter is per session, so 4,096
// distinct denials of one session within a second leave every other
// session's new denials written.
func TestDenialFloodOfOneSessionHidesNoOtherSessions(t *testing.T) {
	var l denialLimiter
	l.init()
	now := time.Unix(1000, 0)
	for i := 0; i < 5000; i++ {
		l.admit("flood", denialKey{"memories", fmt.Sprintf("/p/%d", i), "lookup"}, now)
	}
	if w, _, _ := l.admit("victim", denialKey{"memories", "/private/x", "lookup"}, now); !w {
		t.Fatal("another session's denial was not written during a flood")
	}
	// The flooder's denials beyond what it remembers are counted, and
	// told with its next record.
	w, _, unlisted := l.admit("flood", denialKey{"memories", "/after", "lookup"}, now.Add(2*denialWindow))
	if !w || unlisted != 5000-denialKeys {
		t.Fatalf("after the flood: write %v, unlisted %d, want %d", w, unlisted, 5000-denialKeys)
	}
	// Suppressed repeats of a forgotten denial are told as unlisted.
	k := denialKey{"memories", "/again", "lookup"}
	l.admit("r", k, now)
	l.admit("r", k, now.Add(time.Millisecond))
	told := 0
	for i := 0; i < denialKeys; i++ {
		_, _, unlisted := l.admit("r", denialKey{"memories", fmt.Sprintf("/q/%d", i), "lookup"}, now.Add(2*denialWindow))
		told += unlisted
	}
	if told != 1 {
		t.Fatalf("the forgotten denial's suppressed repeat: %d told, want 1", told)
	}
}

// TestPanicInADecision: a decision that panics fails that call alone with
// -32603 (never an allow), status counts it, and the next call is decided.
func TestPanicInADecision(t *testing.T) {
	d, _ := newDaemon(t, "", "version: 1\nroles:\n  default:\n    tools:\n      t: {mode: allow}\n")
	c, err := control.Dial(d.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fault := func() { panic("test fault in a decision") }
	testDecideFault.Store(&fault)
	err = c.Call("tool.decide", map[string]any{"tool": "t", "args": map[string]any{}}, nil)
	testDecideFault.Store(nil)
	if e, ok := err.(*control.Error); !ok || e.Code != control.CodeInternal {
		t.Fatalf("a panicking decision: %v", err)
	}
	var dec struct{ Decision string }
	if err := c.Call("tool.decide", map[string]any{"tool": "t", "args": map[string]any{}}, &dec); err != nil || dec.Decision != "allow" {
		t.Fatalf("the next decision: %v %v", dec, err)
	}
	var st struct{ Panics map[string]int64 }
	if err := c.Call("status", map[string]any{}, &st); err != nil || st.Panics["control"] != 1 {
		t.Fatalf("status panics: %v %v", st.Panics, err)
	}
}

// TestDefaultMaxSessionsFits: a node whose descriptor limit is 20,000 (a
// container that cannot raise it) serves 10,000 sessions on the shared
// connection by default; TestSessionDescriptors measures what they hold.
func TestDefaultMaxSessionsFits(t *testing.T) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Max < 20000 {
		t.Fatalf("the hard descriptor limit is %d: this test needs 20,000", r.Max)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 20000, Max: r.Max}); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
	if n := DefaultMaxSessions(true); n < 10000 {
		t.Fatalf("DefaultMaxSessions under 20,000 descriptors: %d, want >= 10,000", n)
	}
}

// TestStartFailureStopsEverything: when a step of New fails (here the first
// session's mountpoint is a file), everything started before it stops: the
// metrics socket is gone, no descriptor is left open, and no goroutine of
// the watcher outlives it (goleak, at the end of the package's tests). The
// watcher was left running when the hub or the first session failed.
func TestStartFailureStopsEverything(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"config", "memories", "workspace", "blocks"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	notDir := filepath.Join(root, "file")
	os.WriteFile(notDir, nil, 0o644)
	fds := func() int { ents, _ := os.ReadDir("/proc/self/fd"); return len(ents) }
	before := fds()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	metricsSock := filepath.Join(root, "metrics.sock")
	_, err := New(Config{
		Conditions: filepath.Join(root, "config/conditions.toml"), Policy: filepath.Join(root, "config/policy.yaml"),
		BlocksDir: filepath.Join(root, "blocks"), Memories: filepath.Join(root, "memories"), Workspace: filepath.Join(root, "workspace"),
		Socket: filepath.Join(root, "run/condfs.sock"), SocketGroup: -1, Logger: quiet,
		Metrics: metricsSock, CacheTTL: 2 * time.Second, FirstMount: notDir,
	})
	if err == nil || !strings.Contains(err.Error(), "first session") {
		t.Fatalf("New with a file as the first mountpoint: %v", err)
	}
	if _, err := os.Stat(metricsSock); err == nil {
		t.Error("the metrics socket outlived a failed start")
	}
	if after := fds(); after != before {
		t.Errorf("%d descriptors open after a failed start, %d before", after, before)
	}
}
