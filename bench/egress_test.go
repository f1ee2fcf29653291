package bench

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// egressClient is one program for both sides, so that both are timed the
// same way: "setup N" makes N connections in a row (connect, one byte
// each way, close; a control byte, which the gateway classifies as tcp at
// once) and prints the median in microseconds; "bulk" reads
// 256 MiB and prints the seconds; "many N" holds N connections open at
// once and prints how many answered.
const egressClient = `
import socket, sys, time, statistics
host, port, what, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
if what == "setup":
    ts = []
    for i in range(n):
        t = time.perf_counter()
        s = socket.create_connection(addr)
        s.sendall(b"\x00")
        s.recv(1)
        s.close()
        ts.append(time.perf_counter() - t)
    print(statistics.median(ts) * 1e6)
elif what == "bulk":
    s = socket.create_connection(addr)
    t = time.perf_counter()
    s.sendall(b"\x01")
    got = 0
    buf = bytearray(1 << 20)
    while got < n:
        k = s.recv_into(buf)
        if k == 0:
            break
        got += k
    print(time.perf_counter() - t if got == n else -1)
else:
    cs = []
    for i in range(n):
        c = socket.create_connection(addr, timeout=20)
        c.sendall(b"\x00")
        cs.append(c)
    print(sum(1 for c in cs if c.recv(1) == b"\x00"))
`

// BenchmarkEgress: a run's connections through the egress gateway
// (network = "policy": the capture, the policy's connect decision, the
// daemon's dial, the relay), on each capture (kernel: nftables in the
// run's namespace, kernel TCP both ways; netstack: a veth pair and
// gVisor's stack), against the same client on the host connecting
// directly, in one run: connection setup, a 256 MiB transfer and 256
// connections at once. Root.
//
//	cd bench && go test -run '^$' -bench Egress -benchtime 3x
func BenchmarkEgress(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the egress benchmark needs root (it mounts a view)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go serveEgressBench(ln)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	hosts := filepath.Join(b.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 srv.bench\n"), 0o644)
	conditions := `[sandbox]
binaries = ["/usr/bin/python3"]
network = "policy"
connections = 300
pids = 64
reach_private = ["127.0.0.1"]
hosts = "` + hosts + `"
`
	policy := `version: 1
roles:
  default:
    tools:
      exec: {mode: allow}
      connect:
        mode: allow
        constraints: ['args.host == "srv.bench"', 'args.protocol == "tcp"']
`
	for _, capture := range []string{"kernel", "netstack"} {
		h := newRunHome(b, conditions, policy, "--egress-capture", capture)
		os.WriteFile(filepath.Join(h.root, "workspace/client.py"), []byte(egressClient), 0o644)
		client := func(through bool, args ...string) float64 {
			b.Helper()
			argv := append([]string{"python3", filepath.Join(h.root, "workspace/client.py"), "127.0.0.1", port}, args...)
			if through {
				argv = append(h.run("python3", "/workspace/client.py", "srv.bench", port), args...)
			}
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			v, perr := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
			if err != nil || perr != nil || v < 0 {
				b.Fatalf("%v: %v %s", argv, err, out)
			}
			return v
		}
		const bulk = 256 << 20
		b.Run(capture+"/setup", func(b *testing.B) {
			var direct, gw float64
			for b.Loop() {
				direct += client(false, "setup", "200")
				gw += client(true, "setup", "200")
			}
			n := float64(b.N)
			b.ReportMetric(direct/n, "direct-us")
			b.ReportMetric(gw/n, "gateway-us")
			b.ReportMetric((gw-direct)/n, "added-us")
		})
		b.Run(capture+"/bulk-256MiB", func(b *testing.B) {
			var direct, gw float64
			for b.Loop() {
				direct += client(false, "bulk", strconv.Itoa(bulk))
				gw += client(true, "bulk", strconv.Itoa(bulk))
			}
			b.ReportMetric(bulk/direct/float64(1<<20)*float64(b.N), "direct-MiB/s")
			b.ReportMetric(bulk/gw/float64(1<<20)*float64(b.N), "gateway-MiB/s")
			b.ReportMetric(direct/gw, "ratio")
		})
		b.Run(capture+"/concurrent-256", func(b *testing.B) {
			for b.Loop() {
				if got := client(true, "many", "256"); got != 256 {
					b.Fatalf("%v of 256 connections answered", got)
				}
			}
		})
	}
}

// serveEgressBench: 0 echoes one byte; 1 sends 256 MiB.
func serveEgressBench(ln net.Listener) {
	chunk := make([]byte, 1<<20)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var op [1]byte
			if _, err := io.ReadFull(c, op[:]); err != nil {
				return
			}
			switch op[0] {
			case 0:
				c.Write(op[:])
				io.Copy(io.Discard, c)
			case 1:
				for i := 0; i < 256; i++ {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}
		}()
	}
}
