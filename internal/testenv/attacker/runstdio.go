package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// runStdio sends the run method for `sh -c script` in session with its
// stdio made of kind: "ctl" (stdin a second connection to the control
// socket), "pidfd" (a pidfd of this process), "epoll", "memfd", "execfile"
// (this program's file), "zero" (/dev/zero), "unix" (a socketpair's end),
// "tcp" (an unconnected TCP socket), or "four" (0, 1, 2 and 0 again). It prints the daemon's answer line.
func runStdio(sock, session, kind, script string) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	fds := []int{0, 1, 2}
	switch kind {
	case "ctl":
		c2, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Println("dial:", err)
			return
		}
		f, _ := c2.(*net.UnixConn).File()
		c2.Close()
		fds[0] = int(f.Fd())
	case "pidfd":
		fd, err := unix.PidfdOpen(os.Getpid(), 0)
		if report(err) {
			return
		}
		fds[0] = fd
	case "epoll":
		fd, err := unix.EpollCreate1(0)
		if report(err) {
			return
		}
		fds[0] = fd
	case "memfd":
		fd, err := unix.MemfdCreate("prog", 0)
		if report(err) {
			return
		}
		fds[0] = fd
	case "execfile", "zero":
		// A regular file on a mount that allows execution (this program),
		// and a device that maps as shared memory: the command could map
		// either executable.
		name := "/proc/self/exe"
		if kind == "zero" {
			name = "/dev/zero"
		}
		fd, err := unix.Open(name, unix.O_RDONLY, 0)
		if report(err) {
			return
		}
		fds[0] = fd
	case "unix":
		// A Unix socket carries descriptors both ways
		// (TestStdinSocketPassesNoDescriptorsOut).
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if report(err) {
			return
		}
		fds[0] = sp[0]
	case "tcp":
		// An unconnected socket connects in this network namespace
		// (TestStdinInetSocketReachesNoNetwork).
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if report(err) {
			return
		}
		fds[0] = fd
	case "four":
		fds = append(fds, 0)
	}
	req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "run", "params": map[string]any{
		"session": session, "argv": []string{"sh", "-c", script}, "cwd": "/workspace", "timeout_ms": 20000}})
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(append(req, '\n'), unix.UnixRights(fds...), nil); err != nil {
		fmt.Println("send:", err)
		return
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print(line)
}
