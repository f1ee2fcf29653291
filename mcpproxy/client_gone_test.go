package mcpproxy_test

// The gateway does not outlive its client, and its server does not
// outlive the gateway. Through the real gateway and a Python server.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/mcpproxy"
	"go.uber.org/goleak"
)

// alive reports whether pid runs (a zombie has ended).
func alive(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func serverPid(t *testing.T, g *gateway) string {
	t.Helper()
	for i := 0; i < 200; i++ {
		if pid, err := os.ReadFile(g.pid); err == nil && len(pid) > 0 {
			return string(pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the server wrote no pid")
	return ""
}

// TestGatewayEndsWhenClientCloses: with --grace 300ms and a server that
// ignores the end of its input and SIGTERM, the gateway ends within the
// grace steps (grace, SIGTERM, grace, SIGKILL) of the client closing its
// input, and the server with it.
func TestGatewayEndsWhenClientCloses(t *testing.T) {
	g := startGateway(t, serve(t), []string{"IGNORE_EOF=1", "IGNORE_TERM=1"}, "--grace", "300ms")
	pid := serverPid(t, g)
	start := time.Now()
	g.in.Close()
	if !g.exited(5 * time.Second) {
		t.Fatalf("the gateway still runs %v after its client closed its input (--grace 300ms)", time.Since(start))
	}
	t.Logf("the gateway ended %v after its client closed its input", time.Since(start))
	if alive(pid) {
		t.Errorf("the server (pid %s) outlived the gateway", pid)
	}
}

// TestPendingApprovalDeniedWhenClientCloses: the client closes its input
// while an approval question is pending: the call is answered denied at
// once, and the gateway ends.
func TestPendingApprovalDeniedWhenClientCloses(t *testing.T) {
	g := startGateway(t, serve(t), nil, "--grace", "300ms")
	g.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ask","arguments":{}}}`)
	if q := peerNext(t, g.out, 5*time.Second, "the approval question"); !strings.Contains(q, "elicitation/create") {
		t.Fatalf("expected condfs's question, got %s", q)
	}
	start := time.Now()
	g.in.Close()
	if got := peerNext(t, g.out, 5*time.Second, "the call's answer"); !strings.Contains(got, `"id":1`) || !strings.Contains(got, "client is gone") {
		t.Errorf("the pending call was answered %s", got)
	}
	if !g.exited(5 * time.Second) {
		t.Fatalf("the gateway still runs %v after its client closed its input, a question pending", time.Since(start))
	}
	t.Logf("the gateway ended %v after its client closed its input", time.Since(start))
	if strings.Contains(g.received(), `"tools/call"`) {
		t.Errorf("the call reached the server: %s", g.received())
	}
}

// TestServerDiesWithGateway: a gateway killed with SIGKILL takes its
// server with it (a parent-death signal).
func TestServerDiesWithGateway(t *testing.T) {
	// A server that would not end on the end of its input.
	g := startGateway(t, serve(t), []string{"IGNORE_EOF=1", "IGNORE_TERM=1"})
	pid := serverPid(t, g)
	g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.done
	for i := 0; i < 200 && alive(pid); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		t.Errorf("the server (pid %s) runs on after its gateway was killed", pid)
	}
}

// TestApprovalsInFlightBounded: at most MaxApprovals questions are pending;
// a call that needs one beyond is denied, saying why.
func TestApprovalsInFlightBounded(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	lines := make([]string, mcpproxy.MaxApprovals+1)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ask","arguments":{"n":%d}}}`, i+1, i)
	}
	g.send(lines...)
	got := g.collect(3 * time.Second)
	questions, denied := 0, 0
	for _, l := range got {
		switch {
		case strings.Contains(l, "elicitation/create"):
			questions++
		case strings.Contains(l, "pending already"):
			denied++
		}
	}
	if questions != mcpproxy.MaxApprovals || denied != 1 {
		t.Errorf("%d calls that need approval: %d questions asked, %d denied as too many (want %d and 1)", len(lines), questions, denied, mcpproxy.MaxApprovals)
	}
}

// TestRunEndsItsGoroutinesWhenClientGoes: in process, a client that goes
// with a question pending and calls in flight: the question is answered
// denied, ClientGone is called once the server's input is closed, and
// once the server's output ends Run returns with no goroutine of its left.
func TestRunEndsItsGoroutinesWhenClientGoes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dec := &scriptedDecider{}
	dec.set(func(string) string { return "approval_required" })
	cr, cw := io.Pipe()
	or, ow := io.Pipe()
	sr, sw := io.Pipe()
	tr, tw := io.Pipe()
	gone := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- mcpproxy.Run(context.Background(), mcpproxy.Options{Decider: dec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			ApprovalTimeout: time.Hour, ClientGone: func() { close(gone) }}, cr, ow, sw, tr)
	}()
	out, in := peerLines(or), peerLines(sr)
	r := &proxyRig{t: t, clientIn: cw, clientOut: out, serverIn: in, serverOut: tw}
	r.handshake()
	r.client(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{}}}`)
	if q := peerNext(t, out, 5*time.Second, "the question"); !strings.Contains(q, "elicitation/create") {
		t.Fatalf("expected condfs's question, got %s", q)
	}
	cw.Close()
	if got := peerNext(t, out, 5*time.Second, "the call's answer"); !strings.Contains(got, "client is gone") {
		t.Errorf("the pending call was answered %s", got)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("ClientGone was not called")
	}
	for range in { // the server's input is closed: its reader ends
	}
	tw.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return once the server's output ended")
	}
	ow.Close()
	for range out {
	}
}

// TestClientGoneWhileNotReading: a client that closes its input and reads
// nothing more (a call's answer blocks on it) does not keep the server's
// input open: ClientGone is called within DecideTimeout and a second.
func TestClientGoneWhileNotReading(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dec := &scriptedDecider{}
	dec.set(func(string) string { return "deny" })
	cr, cw := io.Pipe()
	or, ow := io.Pipe() // unbuffered: every write to the client waits for a read
	sr, sw := io.Pipe()
	tr, tw := io.Pipe()
	gone := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- mcpproxy.Run(context.Background(), mcpproxy.Options{Decider: dec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			DecideTimeout: 200 * time.Millisecond, ClientGone: func() { close(gone) }}, cr, ow, sw, tr)
	}()
	in := peerLines(sr)
	io.WriteString(cw, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"secret","arguments":{}}}`+"\n")
	cw.Close()
	select {
	case <-gone:
	case <-time.After(3 * time.Second):
		t.Error("the client is gone, not reading, and the server's input is still open")
	}
	// Read what the client was sent; the server ends.
	out := peerLines(or)
	for range in {
	}
	tw.Close()
	<-done
	ow.Close()
	for range out {
	}
}

// childPid waits for the pid the server's child wrote.
func childPid(t *testing.T, g *gateway) string {
	t.Helper()
	for i := 0; i < 300; i++ {
		if pid, err := os.ReadFile(g.pid + ".child"); err == nil && len(pid) > 0 {
			return string(pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the server's child wrote no pid")
	return ""
}

// TestServerChildrenEndWithGateway: a process the server leaves behind
// (npx, uvx and shell wrappers start the real server as their child),
// holding the server's output and deaf to SIGTERM, ends with the gateway
// when its client closes.
func TestServerChildrenEndWithGateway(t *testing.T) {
	g := startGateway(t, serve(t), []string{"GRANDCHILD=1"}, "--grace", "300ms")
	child := childPid(t, g)
	g.in.Close()
	if !g.exited(5 * time.Second) {
		t.Fatal("the gateway still runs 5s after its client closed its input (--grace 300ms)")
	}
	for i := 0; i < 100 && alive(child); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		t.Errorf("the server's child (pid %s) outlived the gateway", child)
	}
}

// TestServerChildrenDieWithKilledGateway: a gateway killed with SIGKILL
// takes the processes its server left behind with it too.
func TestServerChildrenDieWithKilledGateway(t *testing.T) {
	g := startGateway(t, serve(t), []string{"GRANDCHILD=1", "IGNORE_EOF=1", "IGNORE_TERM=1"})
	child := childPid(t, g)
	g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.done
	for i := 0; i < 300 && alive(child); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		t.Errorf("the server's child (pid %s) runs on after its gateway was killed", child)
	}
}

// TestGatewayEndsWhenClientClosesAndServerReadsNothing: a server that
// reads nothing more (nor ends, nor heeds SIGTERM) holds the gateway in a
// write to it; a client that then closes its input still ends the
// gateway and the server, on the timer.
func TestGatewayEndsWhenClientClosesAndServerReadsNothing(t *testing.T) {
	g := startGateway(t, serve(t), []string{"STOP_READING=1", "IGNORE_TERM=1"}, "--grace", "300ms")
	pid := serverPid(t, g)
	// More than a pipe holds: the gateway's write to the server blocks.
	g.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":%q}}`, strings.Repeat("x", 1<<20)))
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	g.in.Close()
	if !g.exited(15 * time.Second) {
		t.Fatalf("the gateway still runs %v after its client closed its input (--grace 300ms), its server reading nothing", time.Since(start))
	}
	t.Logf("the gateway ended %v after its client closed its input", time.Since(start))
	if alive(pid) {
		t.Errorf("the server (pid %s) outlived the gateway", pid)
	}
}
