package egress

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestRunSocketFamiliesLimited: a network namespace does not isolate every
// socket family. A run could create AF_VSOCK sockets, in the host's own vsock port space (a port
// a host process held was EADDRINUSE in the run), from where CID 2, the
// hypervisor, is reachable with no decision, under any network mode. The
// seccomp filter now lets socket(2) and socketpair(2) create unix, inet,
// inet6 and netlink sockets only (EAFNOSUPPORT otherwise).
func TestRunSocketFamiliesLimited(t *testing.T) {
	// A host process holds vsock port 47123, when the host has vsock.
	host := exec.Command("python3", "-u", "-c", `
import socket, sys
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, 47123))
    s.listen(1)
    print("bound", flush=True)
except OSError as e:
    print("no vsock", e, flush=True)
sys.stdin.readline()
`)
	hin, _ := host.StdinPipe()
	hout, _ := host.StdoutPipe()
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { hin.Close(); host.Wait() }()
	l, _ := bufio.NewReader(hout).ReadString('\n')
	t.Logf("host: %s", strings.TrimSpace(l))

	t.Run("network=none", func(t *testing.T) {
		d, _ := testenv.RunHomeWith(t, testenv.PrivateRule+`
[sandbox]
binaries = ["/usr/bin/python3"]
`)
		out, code := testenv.CondfsRun(t, d, "", "--", "python3", "-c", familiesProbe)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		checkFamilies(t, out)
	})
	t.Run("network=policy", func(t *testing.T) {
		d := egressHome(t)
		checkFamilies(t, egressPy(t, d, familiesProbe))
	})
}
