package control

import (
	"bufio"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClientNeverReadsAnotherCallsAnswer: a call whose answer comes too
// late must not leave it unread on the connection for the next call to
// read as its own (the MCP gateway would take an allowed call's decision
// for a denied call's). A call that fails on the connection breaks the
// client, and an answer to another id is refused.
func TestClientNeverReadsAnotherCallsAnswer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The server answers each line late, or with another id.
	answers := []string{`{"jsonrpc":"2.0","id":1,"result":"late"}`, `{"jsonrpc":"2.0","id":7,"result":"other"}`}
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, a := range answers {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			r.ReadString('\n')
			if a == answers[0] {
				<-release
			}
			c.Write([]byte(a + "\n"))
			r.ReadString('\n') // the next request, never answered
			c.Close()
		}
	}()

	c, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if err := c.Call("echo", map[string]any{}, nil); err == nil {
		t.Fatal("a call past its deadline succeeded")
	}
	close(release)
	time.Sleep(50 * time.Millisecond) // the late answer arrives
	c.SetDeadline(time.Now().Add(time.Second))
	var got string
	err = c.Call("echo", map[string]any{}, &got)
	if err == nil || got == "late" {
		t.Fatalf("the next call read the late answer: %q, %v", got, err)
	}
	if !strings.Contains(err.Error(), "unusable") {
		t.Errorf("the next call's error does not say the connection is unusable: %v", err)
	}

	c2, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(time.Second))
	err = c2.Call("echo", map[string]any{}, &got)
	var ce *Error
	if err == nil || errors.As(err, &ce) || got == "other" {
		t.Fatalf("an answer to another id was taken: %q, %v", got, err)
	}
	if err := c2.Call("echo", map[string]any{}, nil); err == nil {
		t.Error("a client that read an answer to another id made another call")
	}
	l.Close()
	<-done
}
