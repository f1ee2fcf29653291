package integration

import (
	"strings"
	"testing"
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
