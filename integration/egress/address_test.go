package egress

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestConnectToRefusedAddressAnswered403: a CONNECT to an allowed name
// that resolves only to addresses the run may not reach (loopback, the
// link-local metadata address) is answered 403 with why, before any
// tunnel, as a plain HTTP request to it is; one that may be reached still
// gets 200.
func TestConnectToRefusedAddressAnswered403(t *testing.T) {
	d := egressHome(t)
	out := egressPy(t, d, `
import os, socket, urllib.parse
u = urllib.parse.urlparse(os.environ["https_proxy"])
for target in ["loop.test:443", "meta.test:80", "api.test:443"]:
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            b = s.recv(4096)
            if not b:
                break
            head += b
        if head.startswith(b"HTTP/1.1 403"):
            while True:
                b = s.recv(4096)
                if not b:
                    break
                head += b
    except OSError as e:
        head += ("[%s]" % e).encode()
    text = head.decode(errors="replace")
    print(target, text.split("\r\n")[0], "|", text.split("\r\n\r\n", 1)[-1].strip())
    s.close()
`)
	for _, want := range []string{
		"loop.test:443 HTTP/1.1 403 Forbidden | condfs: https loop.test:443: refused: loop.test resolves to 127.0.0.1",
		"meta.test:80 HTTP/1.1 403 Forbidden | condfs: https meta.test:80: refused: meta.test resolves to 169.254.169.254",
		"api.test:443 HTTP/1.1 200",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// TestEgressSelfAddressFormsRefused: a policy that allows every host, and
// reach_private naming the servers' address alone: names (hosts file) and
// literals in every form that reach the host itself or its loopback must
// be refused. A listener of the host, on all its addresses, counts what
// reaches it.
func TestEgressSelfAddressFormsRefused(t *testing.T) {
	n := recordNet(t)
	go http.Serve(n.listen(t, upstreamSrv+":80"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s host=%s", r.Method, r.RequestURI, r.Host)
	}))
	hl, err := net.Listen("tcp", "0.0.0.0:8400")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	var mu sync.Mutex
	reached := 0
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			reached++
			mu.Unlock()
			c.Close()
		}
	}()
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", upstreamSrv+" web.test\n10.239.0.1 self.test\n127.0.0.1 multi.test\n"+upstreamSrv+" multi.test\n"+
		"::ffff:10.239.0.1 mapped.test\n64:ff9b::aef:1 nat64.test\n0.0.0.0 zero.test\n::ffff:127.0.0.1 mloop.test\n")
	rules := strings.Replace(egressRetryRules(hosts), `reach_private = ["10.239.0.0/24"]`, `reach_private = ["`+upstreamSrv+`"]`, 1)
	h.Write("config/conditions.toml", rules)
	h.Write("config/policy.yaml", "version: 1\nroles:\n  default:\n    tools:\n      exec: {mode: allow}\n      connect: {mode: allow}\n")
	os.Chmod(h.Path("workspace"), 0o777)
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(h.Path("run"), 0o755)
	d.OpenFor("s", testenv.Nobody, testenv.DM)
	targets := []string{
		"self.test", "mapped.test", "nat64.test", "zero.test", "mloop.test",
		"10.239.0.1", "[::ffff:10.239.0.1]", "[::ffff:aef:1]", "[64:ff9b::10.239.0.1]", "0.0.0.0", "127.0.0.1",
		"[::1]", "[::]", "[::ffff:127.0.0.1]", "127.1", "2130706433", "0x7f.1", "017700000001", "0177.0.0.1", "10.239.1",
	}
	code := pyRaw + `
import sys
for t in sys.argv[1:]:
    for how in ("proxy", "direct"):
        try:
            if how == "proxy":
                s = socket.create_connection(("198.19.0.1", 3128), timeout=5)
                s.sendall(("GET http://%s:8400/ HTTP/1.1\r\nHost: %s:8400\r\n\r\n" % (t, t)).encode())
            else:
                h = t.strip("[]")
                s = socket.create_connection((h, 8400), timeout=5)
                s.sendall(("GET / HTTP/1.1\r\nHost: %s:8400\r\n\r\n" % t).encode())
            print(how, t, readall(s)[:60], flush=True)
        except Exception as e:
            print(how, t, "error", type(e).__name__, flush=True)
`
	out, _ := testenv.CondfsRun(t, d, "", append([]string{"--", "python3", "-c", code}, targets...)...)
	t.Logf("%s", out)
	// multi.test: 127.0.0.1 is skipped, the servers' address dialled.
	if o, _ := testenv.CondfsRun(t, d, "", "--", "curl", "-sS", "--max-time", "10", "--noproxy", "*", "http://multi.test/m"); !strings.Contains(o, "GET /m host=multi.test") {
		t.Errorf("setup: multi.test was not reached at its allowed address: %s", o)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if reached != 0 {
		t.Errorf("HOLE: %d connections of the run reached a listener of the host itself\n%s", reached, d.Log())
	}
}
