package control

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openFDs counts this process's descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// sendWithFiles writes line with files attached (SCM_RIGHTS).
func sendWithFiles(t *testing.T, c *net.UnixConn, line string, files ...*os.File) {
	t.Helper()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if _, _, err := c.WriteMsgUnix([]byte(line+"\n"), unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
}

// TestPassedFiles: a handler takes the descriptors sent with its request;
// beyond MaxFiles they are closed as they arrive, and what no handler took
// is closed once the request is answered: a client cannot park
// descriptors in the daemon.
func TestPassedFiles(t *testing.T) {
	handler := func(ctx context.Context, method string, _ json.RawMessage) (any, *Error) {
		if method != "take" {
			return map[string]string{}, nil
		}
		files, all := TakeFiles(ctx)
		for _, f := range files {
			f.WriteString("written by the daemon\n")
			f.Close()
		}
		return map[string]any{"files": len(files), "all": all}, nil
	}
	s := serve(t, Options{Group: -1, Handler: handler})
	before := openFDs(t)
	conn, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	r := bufio.NewReader(c)
	var pipes []*os.File
	var readers []*os.File
	for range 5 {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		pipes, readers = append(pipes, pw), append(readers, pr)
	}
	defer func() {
		for _, f := range append(pipes, readers...) {
			f.Close()
		}
	}()
	sendWithFiles(t, c, `{"jsonrpc":"2.0","id":1,"method":"take"}`, pipes...)
	// Five sent: three kept, and the handler learns that some were lost.
	if got, _ := r.ReadString('\n'); !strings.Contains(got, `"files":3`) || !strings.Contains(got, `"all":false`) {
		t.Fatalf("take: %s", got)
	}
	// Descriptors sent with a request whose handler takes none.
	sendWithFiles(t, c, `{"jsonrpc":"2.0","id":2,"method":"other"}`, pipes[:2]...)
	if got, _ := r.ReadString('\n'); !strings.Contains(got, `"result"`) {
		t.Fatalf("other: %s", got)
	}
	for _, p := range pipes {
		p.Close()
	}
	// Every pipe's write end is closed now, here and in the daemon: each
	// reader sees the end (the first three after the daemon's line).
	for i, pr := range readers {
		pr.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 100)
		var all []byte
		for {
			n, err := pr.Read(b)
			all = append(all, b[:n]...)
			if err != nil {
				if !strings.Contains(err.Error(), "EOF") {
					t.Fatalf("pipe %d: %v (a write end stayed open in the daemon)", i, err)
				}
				break
			}
		}
		if want := i < 3; strings.Contains(string(all), "written") != want {
			t.Fatalf("pipe %d: %q", i, all)
		}
	}
	c.Close()
	for _, pr := range readers {
		pr.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for openFDs(t) > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := openFDs(t); n > before {
		t.Fatalf("%d descriptors left open (%d before)", n, before)
	}
}

// TestTakeover: a handler that takes the connection over reads what the
// client sends after the request and answers the request itself.
func TestTakeover(t *testing.T) {
	handler := func(ctx context.Context, method string, _ json.RawMessage) (any, *Error) {
		if method != "stream" {
			return map[string]string{}, nil
		}
		return Takeover(func(ctx context.Context, s *Stream) {
			n := 0
			for {
				line, err := s.R.ReadString('\n')
				if err != nil {
					break
				}
				if strings.TrimSpace(line) == "end" {
					break
				}
				n++
			}
			s.Respond(map[string]int{"lines": n}, nil)
		}), nil
	}
	s := serve(t, Options{Group: -1, Handler: handler})
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The request and what follows in one write: the takeover gets the
	// bytes the server had buffered.
	c.Write([]byte("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"stream\"}\na\nb\n"))
	c.Write([]byte("c\nend\n"))
	got, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(got, `"id":7`) || !strings.Contains(got, `"lines":3`) {
		t.Fatalf("takeover: %s", got)
	}
}
