package fuseconn

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// mountFusermount mounts mp through fusermount3 (fusermount on older
// systems), the setuid helper that lets an ordinary user mount FUSE, and
// receives the /dev/fuse fd it opened over a socket (the _FUSE_COMMFD
// protocol libfuse and go-fuse speak). The daemon then holds the connection
// exactly as after its own mount(2).
func mountFusermount(mp string, allowOther bool) (int, error) {
	bin, err := fusermountBinary()
	if err != nil {
		return -1, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	local, remote := os.NewFile(uintptr(pair[0]), "fusermount-local"), os.NewFile(uintptr(pair[1]), "fusermount-remote")
	defer local.Close()
	opts := "default_permissions,fsname=condfs,subtype=condfs"
	if allowOther {
		opts += ",allow_other"
	}
	cmd := exec.Command(bin, "-o", opts, "--", mp)
	cmd.Env = []string{"_FUSE_COMMFD=3"}
	cmd.ExtraFiles = []*os.File{remote} // fd 3
	out, err := cmd.CombinedOutput()
	remote.Close()
	if err != nil {
		return -1, fmt.Errorf("%s: %v: %s", bin, err, strings.TrimSpace(string(out)))
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(local.Fd()), buf, oob, 0)
	if err != nil {
		FusermountUnmount(mp)
		return -1, fmt.Errorf("receive the fd from %s: %w", bin, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil && len(msgs) == 1 {
		var fds []int
		if fds, err = unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
			unix.CloseOnExec(fds[0])
			return fds[0], nil
		}
	}
	FusermountUnmount(mp)
	return -1, fmt.Errorf("%s sent no fd", bin)
}

// FusermountUnmount unmounts a mount fusermount3 made (lazily if busy):
// what a daemon without the privilege to unmount uses.
func FusermountUnmount(mp string) error {
	bin, err := fusermountBinary()
	if err != nil {
		return err
	}
	out, err := exec.Command(bin, "-u", "--", mp).CombinedOutput()
	if err == nil {
		return nil
	}
	if out2, err2 := exec.Command(bin, "-u", "-z", "--", mp).CombinedOutput(); err2 != nil {
		return fmt.Errorf("%s -u %s: %v: %s %s", bin, mp, err2, strings.TrimSpace(string(out)), strings.TrimSpace(string(out2)))
	}
	return nil
}

func fusermountBinary() (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("neither fusermount3 nor fusermount is installed: install fuse3 (or run condfs as root)")
}
