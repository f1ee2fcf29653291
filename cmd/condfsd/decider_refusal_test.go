package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// TestDeciderRecoversAfterRefusal: control.Client now breaks on any
// failed call, the daemon's refusal line ({"id":null,"error":...}, sent
// when a connection gets no slot: control/slots.go refuse, e.g. the
// gateway's uid at --max-conns-per-uid while its `condfs run`s hold
// connections, or a request line over control.MaxLine) included; it
// comes back as a *control.Error. socketDecider.call keeps a client that
// answered a *control.Error (it takes it for a decision's error on a
// usable connection), and every later Call wraps the same *control.Error
// ("unusable after an earlier failure: %w"), so errors.As matches again
// and the client is never dropped: one refusal makes the MCP gateway deny
// every later tool call of its session ("the condfs daemon gave no
// decision") although the daemon answers new connections. Before the
// change the next call hit the closed connection and redialled.
func TestDeciderRecoversAfterRefusal(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func(c net.Conn, n int32) {
				defer c.Close()
				if n == 1 {
					// What control/slots.go refuse writes: one line, then close.
					c.Write([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32013,"message":"uid 1000 has 16 control connections open, the most a uid other than root and the daemon's may hold (--max-conns-per-uid); close one and retry"}}` + "\n"))
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					var req struct {
						ID json.RawMessage `json:"id"`
					}
					json.Unmarshal(line, &req)
					fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"result":{"decision":"allow","role":null,"reasons":[]}}`+"\n", req.ID)
				}
			}(c, n)
		}
	}()
	d := &socketDecider{socket: sock, session: "s1"}
	defer d.close()
	_, _, err = d.Decide(context.Background(), "echo", json.RawMessage(`{}`))
	t.Logf("call 1 (connection refused by the daemon): %v", err)
	for i := 2; i <= 5; i++ {
		dec, _, err := d.Decide(context.Background(), "echo", json.RawMessage(`{}`))
		if err == nil && dec == "allow" {
			t.Logf("call %d: allow (connections made: %d)", i, conns.Load())
			return
		}
		t.Logf("call %d: %q, %v", i, dec, err)
	}
	t.Errorf("HOLE: after one refusal line the gateway's decider never dials again (%d connection(s) made): every later tool call is denied for want of a decision", conns.Load())
}
