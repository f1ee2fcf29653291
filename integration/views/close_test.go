package views

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestSessionCloseWhileFilesBusy: fsys closeBacking releases a view's handles
// when its own connection ends (per-session connections). Here the
// session is closed while its owner's threads hammer its files with pread,
// fstat, ftruncate and fchmod, and open and close more: a release racing a
// request in flight would close an fd those requests still use, whose
// number another view's open (a canary file opened and read in a loop
// through another session) may have taken by then. The canary must keep
// its content and mode, and the uid must get its whole share of files in a
// fresh session at the end.
func TestSessionCloseWhileFilesBusy(t *testing.T) {
	for _, conns := range []string{"per-session", "shared"} {
		t.Run(conns, func(t *testing.T) { closeWhileBusy(t, conns) })
	}
}

func closeWhileBusy(t *testing.T, conns string) {
	h := testenv.OpenHome(t, testenv.RunRules)
	h.Write("config/policy.yaml", testenv.RunPolicy)
	h.Write("workspace/w.txt", "work\n")
	canary := h.Write("workspace/canary.txt", "CANARY-CONTENT-0123456789\n")
	os.Chmod(canary, 0o644)
	os.Chmod(h.Path("workspace"), 0o777)
	os.MkdirAll(h.Path("mnt"), 0o777)
	d := testenv.StartUnder(t, h, testenv.NofileLimit(2048),
		"--allow-uid", "65534", "--socket-mode", "0666", "--connections="+conns)
	vmnt := d.OpenFor("victim", testenv.Nobody, testenv.DM)
	reader := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", `
import os, sys, time
end = time.time() + float(sys.argv[2])
n = bad = 0
while time.time() < end:
    try:
        fd = os.open(sys.argv[1], os.O_RDONLY)
        b = os.pread(fd, 100, 0)
        os.close(fd)
        n += 1
        if b != b"CANARY-CONTENT-0123456789\n":
            bad += 1
            print("canary read", repr(b), flush=True)
    except OSError as e:
        pass
print("canary reads", n, "bad", bad, flush=True)
`, vmnt+"/workspace/canary.txt", "180")
	var rout strings.Builder
	reader.Stdout, reader.Stderr = &rout, &rout
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { reader.Process.Kill(); reader.Wait() }()
	const busy = `
import os, sys, threading, time
d = sys.argv[1]
mine = os.path.join(d, "mine-%s.txt" % sys.argv[2])
with open(mine, "w") as f:
    f.write("x" * 4096)
fds = [os.open(mine, os.O_RDWR) for _ in range(32)]
print("ready", flush=True)
stop = time.time() + 6
ok, bad = [0], [0]
def work(i):
    k = 0
    while time.time() < stop:
        fd = fds[(i * 7 + k) % len(fds)]
        k += 1
        for op in (lambda: os.pread(fd, 4096, 0), lambda: os.fstat(fd), lambda: os.ftruncate(fd, 5),
                   lambda: os.fchmod(fd, 0o600), lambda: os.close(os.open(mine, os.O_RDONLY))):
            try:
                op()
                ok[0] += 1
            except OSError:
                bad[0] += 1
ts = [threading.Thread(target=work, args=(i,)) for i in range(12)]
for x in ts: x.start()
for x in ts: x.join()
print("ops ok", ok[0], "failed", bad[0], flush=True)
`
	for i := 0; i < 6; i++ {
		id := fmt.Sprintf("b%d", i)
		mnt := d.OpenFor(id, testenv.Nobody, testenv.DM)
		cmd := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", busy, mnt+"/workspace", strconv.Itoa(i))
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		time.Sleep(500 * time.Millisecond)
		d.Call("session.close", map[string]any{"id": id}, nil)
		done := make(chan struct{})
		go func() { l, _ := br.ReadString('\n'); line += " " + l; cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("cycle %d: the busy process did not end", i)
		}
		t.Logf("cycle %d: %s", i, strings.TrimSpace(line))
	}
	reader.Process.Signal(unix.SIGTERM)
	time.Sleep(time.Second)
	st, err := os.Stat(canary)
	b, _ := os.ReadFile(canary)
	if err != nil || string(b) != "CANARY-CONTENT-0123456789\n" || st.Mode().Perm() != 0o644 {
		t.Errorf("HOLE: another session's file changed while closed sessions' handles were released: %q mode %v", b, st.Mode())
	}
	if strings.Contains(rout.String(), "canary read") {
		t.Errorf("HOLE: the canary session read other bytes: %s", rout.String())
	}
	time.Sleep(2 * time.Second)
	mnt := d.OpenFor("fresh", testenv.Nobody, testenv.DM)
	got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", 120)
	stop()
	t.Logf("fresh session: %s; canary reader: %s", got, rout.String())
	if got != "held 120 err none" {
		t.Errorf("HOLE: after sessions were closed while busy, a fresh session of the uid opens only %q", got)
	}
	if strings.Contains(d.Log(), "panic") {
		t.Errorf("the daemon panicked:\n%s", testenv.Tail(d.Log(), 40))
	}
}
