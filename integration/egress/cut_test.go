package egress

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestEgressSwitchCutsKeptSandboxConnections: a context switch decides again the connections
// of the session's runs (s.runs), but a sandbox kept for the session's
// next run (runs/warm.go) has left s.runs while its gateway still serves
// the connections its last command opened: what that command wrote before
// it ended (the capture's buffers and its own socket's) still flows
// upstream after a switch that denies the host, and the switch does not cut
// it. The server here reads nothing until the switch has returned, then
// counts what arrives: all the command sent means nothing was cut.
func TestEgressSwitchCutsKeptSandboxConnections(t *testing.T) {
	toGuild := func(d *testenv.Daemon) { d.SetContext("s", testenv.Guild) } // echo.test is allowed only in a DM
	reload := func(d *testenv.Daemon) {
		d.Home.Write("config/policy.yaml", strings.Replace(egressPolicy, `args.host != "echo.test" or when("discord:dm")`, `args.host != "echo.test"`, 1))
		d.Call("config.reload", map[string]any{}, nil)
	}
	// The control: while the command runs, the switch cuts, and what
	// the buffers held is lost.
	t.Run("control: the command still runs", func(t *testing.T) { keptRunCut(t, toGuild, true) })
	t.Run("context.set", func(t *testing.T) { keptRunCut(t, toGuild, false) })
	t.Run("policy reload", func(t *testing.T) { keptRunCut(t, reload, false) })
}

// TestEgressCutDropsQueuedBytes: a cut closes the upstream socket
// gracefully (net.Conn.Close): what the gateway had queued toward the
// server before the switch (the send buffer the kernel autotunes, up to
// tcp_wmem's 4 MiB) is still sent after the switch returned, while the
// server reads. Only what the server's kernel held before the switch may
// reach it.
func TestEgressCutDropsQueuedBytes(t *testing.T) {
	inq, got := keptRunCut(t, func(d *testenv.Daemon) { d.SetContext("s", testenv.Guild) }, true)
	if inq < 0 {
		t.Fatal("setup: no SIOCINQ of the server's socket")
	}
	if late := got - int64(inq); late > 64<<10 {
		t.Errorf("HOLE: %d bytes the gateway had queued toward echo.test reached it after the context switch that cut the connection returned (the upstream is closed gracefully, not reset)", late)
	}
}

func keptRunCut(t *testing.T, deny func(d *testenv.Daemon), live bool) (inq int, got int64) {
	d, n := netHome(t)
	l := n.listen(t, upstreamSrv+":7100")
	start := make(chan struct{})
	total := make(chan int64, 1)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			total <- -1
			close(accepted)
			return
		}
		defer c.Close()
		accepted <- c
		<-start
		var got int64
		buf := make([]byte, 64<<10)
		for {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			k, err := c.Read(buf)
			got += int64(k)
			if err != nil {
				break
			}
		}
		total <- got
	}()
	// A run first, so that the next one runs "in a row" and its sandbox
	// is kept once its command ends.
	testenv.CondfsRun(t, d, "", "--", "/bin/sh", "-c", "exit 0")
	code := `
import socket, time, sys
s = socket.create_connection(("echo.test", 7100), timeout=10)
s.setblocking(False)
sent, chunk, last = 0, (b"x" * 63 + b"\n") * 1024, time.time()
while time.time() - last < 1.5:
    try:
        sent += s.send(chunk)
        last = time.time()
    except BlockingIOError:
        time.sleep(0.05)
print("sent", sent, flush=True)
if len(sys.argv) > 1:
    time.sleep(30)
`
	var out string
	if live {
		_, line := egressLive(t, d, "s", "import sys\nsys.argv.append('live')\n"+code)
		out = line()
	} else {
		out, _ = testenv.CondfsRun(t, d, "", "--", "python3", "-c", code)
	}
	var sent int64 = -1
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "sent" {
			sent, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if sent <= 0 {
		t.Fatalf("the run: %s\n%s", out, d.Log())
	}
	time.Sleep(time.Second) // the run leaves s.runs once answered
	var st map[string]any
	d.Call("status", map[string]any{}, &st)
	t.Logf("status.runs after the run: %v; egress %v", st["runs"], st["egress"])
	// What the server's kernel holds of it before the change: the server
	// reads nothing, so nothing more arrives until it does.
	inq = -1
	if c, ok := <-accepted; ok {
		if rc, err := c.(*net.TCPConn).SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		}
	}
	deny(d)
	close(start)
	select {
	case got = <-total:
	case <-time.After(60 * time.Second):
		t.Fatal("the server never ended")
	}
	t.Logf("the command sent %d bytes; the server held %d before the change and got %d in all", sent, inq, got)
	if got >= sent {
		t.Errorf("HOLE: after a change that denies echo.test returned, all %d bytes the ended command wrote reached echo.test:7100 (the kept sandbox's connection was not cut)", got)
	}
	return inq, got
}
