package integration

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
)

// familiesProbe tries every socket family a run might reach the world by;
// it prints "created NAME" for each it got. On a host with a virtio vsock
// device (these VMs), vsock also tells whether its port space is the
// host's.
const familiesProbe = `
import socket, errno
for fam, name in ((40, "vsock"), (30, "tipc"), (21, "rds"), (29, "can"), (31, "bluetooth"), (38, "alg"), (41, "kcm"), (42, "qipcrtr"), (43, "smc"), (44, "xdp"), (45, "mctp"), (4, "ipx"), (5, "appletalk"), (9, "x25"), (3, "ax25"), (36, "ieee802154"), (37, "caif"), (18, "ash"), (17, "packet"), (16, "netlink")):
    for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            socket.socket(fam, typ, 0)
            print("created", name)
            break
        except OSError:
            pass
    else:
        print("none", name)
try:
    s = socket.socket(40, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, 47123))
    print("vsock bind: own port space")
except OSError as e:
    print("vsock bind:", errno.errorcode[e.errno])
`

// TestAttackSocketFamilies: a network namespace does not isolate every
// socket family. An attacker's review of the egress capture created
// AF_VSOCK sockets from a run, in the host's own vsock port space (a port
// a host process held was EADDRINUSE in the run), from where CID 2, the
// hypervisor, is reachable with no decision, under any network mode. The
// seccomp filter now lets socket(2) and socketpair(2) create unix, inet,
// inet6 and netlink sockets only (EAFNOSUPPORT otherwise).
func TestAttackSocketFamilies(t *testing.T) {
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
		d, _ := runHomeWith(t, privateRule+`
[sandbox]
binaries = ["/usr/bin/python3"]
`)
		out, code := condfsRun(t, d, "", "--", "python3", "-c", familiesProbe)
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

// checkFamilies fails t unless the probe's run created netlink sockets
// alone, and vsock answered EAFNOSUPPORT.
func checkFamilies(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, "none netlink") && !strings.Contains(out, "created netlink") {
		t.Fatalf("the probe did not finish:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "created ") && line != "created netlink" {
			t.Errorf("HOLE: %s", line)
		}
	}
	if !strings.Contains(out, "vsock bind: EAFNOSUPPORT") {
		t.Errorf("vsock: want EAFNOSUPPORT\n%s", out)
	}
}
