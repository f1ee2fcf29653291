package control

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func echo(ctx context.Context, method string, params json.RawMessage) (any, *Error) {
	switch method {
	case "echo":
		return params, nil
	case "fail":
		return nil, Errorf(CodeUnknownSession, "no such session")
	}
	return nil, Errorf(CodeMethodNotFound, "unknown method %q", method)
}

func serve(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "run", "c.sock")
	}
	if opts.Handler == nil {
		opts.Handler = echo
	}
	s, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Serve(); close(done) }()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return s
}

func TestProtocol(t *testing.T) {
	s := serve(t, Options{Group: -1})
	st, err := os.Stat(s.Addr())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v %v, want 0600", st.Mode(), err)
	}
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for _, tc := range []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":1}}`, `{"jsonrpc":"2.0","id":1,"result":{"a":1}}`},
		{`{"jsonrpc":"2.0","id":"x","method":"fail"}`, `{"jsonrpc":"2.0","id":"x","error":{"code":-32001,"message":"no such session"}}`},
		{`{"jsonrpc":"2.0","id":2,"method":"nope"}`, `"code":-32601`},
		{`{oops`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32700`},
		{`42`, `"code":-32600`},
		{`{"jsonrpc":"2.0","id":{},"method":"echo"}`, `"code":-32600`},
		{`{"id":3,"method":"echo"}`, `"id":3,"error":{"code":-32600`},
		{`{"jsonrpc":"2.0","id":4,"method":"echo"}`, `{"jsonrpc":"2.0","id":4,"result":{}}`},
	} {
		fmt.Fprintln(c, tc.in)
		got, err := r.ReadString('\n')
		if err != nil || !strings.Contains(got, tc.want) {
			t.Fatalf("%s: got %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
	// A notification gets no answer; the next request does.
	fmt.Fprintln(c, `{"jsonrpc":"2.0","method":"echo"}`)
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":5,"method":"echo"}`)
	if got, _ := r.ReadString('\n'); !strings.Contains(got, `"id":5`) {
		t.Fatalf("after a notification: %q", got)
	}
	// Oversized: error, then the connection closes.
	fmt.Fprintf(c, "%s\n", strings.Repeat("x", MaxLine+1))
	if got, _ := r.ReadString('\n'); !strings.Contains(got, "-32600") {
		t.Fatalf("oversized: %q", got)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection open after an oversized line")
	}
}

func TestExactlyMaxLineIsAccepted(t *testing.T) {
	s := serve(t, Options{Group: -1})
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prefix := `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"p":"`
	suffix := `"}}`
	line := prefix + strings.Repeat("y", MaxLine-len(prefix)-len(suffix)) + suffix
	fmt.Fprintln(c, line)
	got, err := bufio.NewReaderSize(c, 2<<20).ReadString('\n')
	if err != nil || !strings.Contains(got, `"result"`) {
		t.Fatalf("a line of exactly %d bytes: %.100q %v", MaxLine, got, err)
	}
}

// TestStalledClientsAreCut: a client that sends half a line, and one that
// never reads its answers, are cut off; others are served meanwhile.
func TestStalledClientsAreCut(t *testing.T) {
	s := serve(t, Options{Group: -1, IdleTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	half, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	fmt.Fprint(half, `{"jsonrpc":"2.0","id":1,"meth`)
	deaf, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	big := `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"p":"` + strings.Repeat("z", 500<<10) + `"}}` + "\n"
	go func() {
		for i := 0; i < 50; i++ {
			if _, err := deaf.Write([]byte(big)); err != nil {
				return
			}
		}
	}()
	c, err := Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Call("echo", map[string]int{"a": 1}, nil); err != nil {
		t.Fatalf("a well-behaved client was held up: %v", err)
	}
	half.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(half).ReadString('\n'); err == nil {
		t.Fatal("a stalled half line got an answer")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.slots.all)
		s.mu.Unlock()
		if n <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open; stalled clients were not cut", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLiveSocketRefused(t *testing.T) {
	s := serve(t, Options{Group: -1})
	if _, err := Listen(Options{Path: s.Addr(), Handler: echo, Group: -1}); err == nil || !strings.Contains(err.Error(), "live daemon") {
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	// A stale file is replaced.
	stale := filepath.Join(t.TempDir(), "s.sock")
	os.WriteFile(stale, nil, 0o600)
	s2, err := Listen(Options{Path: stale, Handler: echo, Group: -1})
	if err != nil {
		t.Fatalf("stale socket file not replaced: %v", err)
	}
	s2.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("Close left the socket file")
	}
}

func TestUnsafeDirectoryRefused(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	if _, err := Listen(Options{Path: filepath.Join(dir, "s.sock"), Handler: echo, Group: -1}); err == nil {
		t.Fatal("a world-writable socket directory was accepted")
	}
}

// BenchmarkEcho is the baseline for the daemon's tool.decide benchmark: a
// bare JSON-RPC echo over a persistent connection.
func BenchmarkEcho(b *testing.B) {
	s := serve(b, Options{Group: -1})
	c, err := Dial(s.Addr())
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

// TestMaxConns: one connection over --max-conns gets an error line and is
// closed; once a connection closes, a new one is served again.
func TestMaxConns(t *testing.T) {
	s := serve(t, Options{Group: -1, MaxConns: 2})
	var held []net.Conn
	call := func(c net.Conn) string {
		fmt.Fprintln(c, `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":1}}`)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	for i := 0; i < 2; i++ {
		c, err := net.Dial("unix", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := call(c); !strings.Contains(got, `"result"`) {
			t.Fatalf("connection %d: %s", i, got)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(extra).ReadString('\n')
	extra.Close()
	if !strings.Contains(line, fmt.Sprint(CodeBusy)) || !strings.Contains(line, "max-conns") {
		t.Fatalf("connection over the limit: %q", line)
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("unix", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		got := call(c)
		c.Close()
		if strings.Contains(got, `"result"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection's place was never freed: %s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDuplicateKeys: a duplicate key at any depth is an invalid request,
// and the connection stays usable.
func TestDuplicateKeys(t *testing.T) {
	s := serve(t, Options{Group: -1})
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"echo","method":"fail","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":[{"b":1,"b":2}]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":{"c":{"d":1,"d":1}}}}`,
		// Keys encoding/json folds together (U+017F long s, U+212A Kelvin,
		// ASCII case): it would keep the last.
		`{"jsonrpc":"2.0","id":1,"method":"echo","methoD":"fail","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"args":{"to":1},"argſ":{"to":2}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"k":1,"K":2}}`,
	} {
		fmt.Fprintln(c, line)
		got, _ := r.ReadString('\n')
		if !strings.Contains(got, "-32600") || !strings.Contains(got, "duplicate key") {
			t.Fatalf("%s: %s", line, got)
		}
	}
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":2,"method":"echo","params":{"a":[{"b":1},{"b":2}],"c":{"b":3}}}`)
	if got, _ := r.ReadString('\n'); !strings.Contains(got, `"result"`) {
		t.Fatalf("same key in different objects: %s", got)
	}
}

// TestPanicFailsOneRequest: a handler that panics answers -32603 for that
// request; the connection and the server go on, and the panic is counted.
func TestPanicFailsOneRequest(t *testing.T) {
	s := serve(t, Options{Group: -1, Handler: func(ctx context.Context, method string, params json.RawMessage) (any, *Error) {
		if method == "boom" {
			panic("test fault in a control method")
		}
		return echo(ctx, method, params)
	}})
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":1,"method":"boom","params":{}}`)
	if got, _ := r.ReadString('\n'); !strings.Contains(got, "-32603") {
		t.Fatalf("a panicking method: %s", got)
	}
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":2,"method":"echo","params":{"a":1}}`)
	if got, _ := r.ReadString('\n'); !strings.Contains(got, `"result"`) {
		t.Fatalf("after the panic: %s", got)
	}
	if s.Panics() != 1 {
		t.Fatalf("%d panics counted", s.Panics())
	}
}
