package changes

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// An unprivileged daemon's layer. Only root may mount overlayfs in the
// daemon's own namespaces, but the root of a user namespace may mount it
// there (Linux 5.11), with user.overlay.* xattrs (userxattr) and
// whiteouts as any user may make them (a 0/0 character device, 5.8). A
// child process in a user namespace of its own, where the daemon's uid and
// gid are root, and a mount namespace that namespace owns, makes the mount
// with the new mount API and hands the daemon the mount itself (the
// descriptor fsmount gives), attached nowhere: the daemon serves the view
// from that descriptor (fsys.Options.MemoriesRoot) and the child exits.
// A mount attached nowhere lives while a descriptor of it is open, so a
// remount is a new child's mount swapped in for the old one, which goes
// when the view's last descriptor of it closes. No other process can
// reach it: no path leads to it.
//
// What overlayfs does as the mounter (copying a file up, making a
// whiteout) it does as the namespace's root: the daemon's uid, with no
// authority over another uid's files (a file of another owner the
// session changes cannot be copied up: EOVERFLOW or EPERM).

// MountHelper is the program run as the child that mounts an unprivileged
// daemon's layer: the daemon itself, which calls MountMain when its first
// argument is "layer-mount".
var MountHelper = "/proc/self/exe"

// mountHelperTimeout bounds a child's mount.
const mountHelperTimeout = 10 * time.Second

// mountFD is the child's end of the socket it answers on; lowerFD is the
// backing directory the layer opened.
const (
	mountFD = 3
	lowerFD = 4
)

// MountMain is the child's program: it mounts the layer named by its
// arguments (lowerdir, upperdir, workdir) and sends the mount's descriptor
// on fd 3, or an error's text. It never returns.
func MountMain() {
	err := mountChild(os.Args[2:])
	if err == nil {
		os.Exit(0)
	}
	msg := []byte("error " + err.Error())
	unix.Sendmsg(mountFD, msg, nil, nil, 0)
	os.Exit(1)
}

func mountChild(args []string) error {
	if len(args) != 3 {
		return errors.New("layer-mount: want lowerdir upperdir workdir")
	}
	if os.Getuid() != 0 {
		// Only the daemon starts it, in a user namespace where it is root.
		return errors.New("layer-mount: only the daemon starts the layer's mount")
	}
	lower, err := sameLower(args[0], lowerFD)
	if err != nil {
		return err
	}
	defer unix.Close(lower)
	m, err := fsmountOverlay(lowerFDPath(lower), args[1], args[2])
	if err != nil {
		return err
	}
	return unix.Sendmsg(mountFD, []byte("ok"), unix.UnixRights(m), nil, 0)
}

// sameLower opens lower, with no symlink on the way, and gives its
// descriptor if it is the directory the daemon opened (fd want): a writer
// of the backing root's parent may have renamed it away and put another
// directory or a symlink at its path. overlayfs takes a lower directory
// of the child's own mount namespace only, so the child opens it again
// rather than stacking over the daemon's descriptor.
func sameLower(lower string, want int) (int, error) {
	fd, err := safepath.OpenDir(lower)
	if err != nil {
		return -1, fmt.Errorf("layer-mount: backing %w", err)
	}
	// From what the kernel has (AT_STATX_DONT_SYNC): a FUSE filesystem a
	// user mounted at the path is never asked, and never holds the child.
	var got, w unix.Statx_t
	const flags = unix.AT_EMPTY_PATH | unix.AT_STATX_DONT_SYNC
	if err := unix.Statx(fd, "", flags, unix.STATX_INO, &got); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("layer-mount: backing %s: %w", lower, err)
	}
	if err := unix.Statx(want, "", flags, unix.STATX_INO, &w); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("layer-mount: the daemon's backing directory: %w", err)
	}
	if got.Dev_major != w.Dev_major || got.Dev_minor != w.Dev_minor || got.Ino != w.Ino {
		unix.Close(fd)
		return -1, fmt.Errorf("layer-mount: backing %s is no longer the directory the layer opened", lower)
	}
	return fd, nil
}

// lowerFDPath names the directory open on fd for overlayfs's lowerdir: the
// magic link leads to that directory whatever its path names now (a
// writer of the backing root's parent may have renamed it away and put a
// symlink there). It has no , : or \.
func lowerFDPath(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}

// mountInUserNS runs the child that mounts sp's layer over work and gives
// the mount's descriptor (O_PATH, of its root). ErrLayerUnavailable: the
// kernel lets no user namespace be made, or no overlayfs be mounted in
// one.
func mountInUserNS(sp *layerSpace, work string) (int, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("staged: %w", err)
	}
	defer unix.Close(pair[0])
	child := os.NewFile(uintptr(pair[1]), "layer-mount")
	// The child stacks the layer over the directory the layer opened (its
	// fd 4), not over whatever sp.lower names by now.
	lfd, err := unix.FcntlInt(uintptr(sp.lowerFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		child.Close()
		return -1, fmt.Errorf("staged: %w", err)
	}
	lowerFile := os.NewFile(uintptr(lfd), "lower")
	cmd := exec.Command(MountHelper, "layer-mount", sp.lower, sp.upper, work)
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{child, lowerFile}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	uid, gid := userNSHost(os.Geteuid(), os.Getegid())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  syscall.SIGKILL,
	}
	err = cmd.Start()
	child.Close()
	lowerFile.Close()
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSPC) {
			return -1, fmt.Errorf("%w: no user namespace can be made: %v", ErrLayerUnavailable, err)
		}
		return -1, fmt.Errorf("staged: start the layer's mount: %w", err)
	}
	timer := time.AfterFunc(mountHelperTimeout, func() { cmd.Process.Kill() })
	defer timer.Stop()
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, rerr := unix.Recvmsg(pair[0], buf, oob, unix.MSG_CMSG_CLOEXEC)
	werr := cmd.Wait()
	fd := -1
	if rerr == nil && oobn > 0 {
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					for _, f := range fds {
						if fd < 0 {
							fd = f
						} else {
							unix.Close(f)
						}
					}
				}
			}
		}
	}
	msg := string(buf[:max(n, 0)])
	if fd >= 0 && msg == "ok" && werr == nil {
		return fd, nil
	}
	if fd >= 0 {
		unix.Close(fd)
	}
	why := strings.TrimPrefix(msg, "error ")
	if why == "" {
		why = fmt.Sprintf("%v %v: %s", rerr, werr, strings.TrimSpace(stderr.String()))
	}
	if strings.Contains(why, "fsopen") || strings.Contains(why, "create the overlay: operation not permitted") {
		return -1, fmt.Errorf("%w: %s", ErrLayerUnavailable, why)
	}
	return -1, fmt.Errorf("staged: mount the layer of %s: %s", sp.name, why)
}
