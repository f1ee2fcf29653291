// Command probe is run confined by the confine package's tests: it tries
// what the confinement must refuse or allow and prints what happened as
// JSON on stdout.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// int80 issues an i386 syscall through int $0x80 and returns the raw result
// (a negative errno on failure).
func int80(nr, a1, a2, a3 uintptr) uintptr

func errno(err error) int {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return int(e)
	}
	return -1
}

func raw(nr uintptr, a ...uintptr) int {
	var v [6]uintptr
	copy(v[:], a)
	_, _, e := syscall.RawSyscall6(nr, v[0], v[1], v[2], v[3], v[4], v[5])
	return int(e)
}

// refused tries each refused syscall with arguments that do nothing
// harmful should the call go through.
func refused() map[string]int {
	c := func(s string) uintptr { p, _ := unix.BytePtrFromString(s); return uintptr(unsafe.Pointer(p)) }
	var ch byte = 'x'
	chp := uintptr(unsafe.Pointer(&ch))
	m := map[string]int{
		"mount":             raw(unix.SYS_MOUNT, c("none"), c("/nonexistent"), c("tmpfs"), 0, 0),
		"umount2":           raw(unix.SYS_UMOUNT2, c("/nonexistent"), 0),
		"pivot_root":        raw(unix.SYS_PIVOT_ROOT, c("/nonexistent"), c("/nonexistent")),
		"chroot":            raw(unix.SYS_CHROOT, c("/")),
		"unshare":           raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER),
		"setns":             raw(unix.SYS_SETNS, ^uintptr(0), 0),
		"ptrace":            raw(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, 0x7ffffff0, 0, 0),
		"process_vm_readv":  raw(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), 0, 0, 0, 0, 0),
		"process_vm_writev": raw(unix.SYS_PROCESS_VM_WRITEV, uintptr(os.Getpid()), 0, 0, 0, 0, 0),
		"bpf":               raw(unix.SYS_BPF, 0xffff, 0, 0),
		"perf_event_open":   raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0),
		"userfaultfd":       raw(unix.SYS_USERFAULTFD, 0xffffffff),
		"io_uring_setup":    raw(unix.SYS_IO_URING_SETUP, 0, 0),
		"io_uring_enter":    raw(unix.SYS_IO_URING_ENTER, ^uintptr(0), 0, 0, 0, 0, 0),
		"io_uring_register": raw(unix.SYS_IO_URING_REGISTER, ^uintptr(0), 0, 0, 0),
		"keyctl":            raw(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffc), 0), // KEY_SPEC_PROCESS_KEYRING, no create
		"add_key":           raw(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0),
		"request_key":       raw(unix.SYS_REQUEST_KEY, 0, 0, 0, 0),
		"open_by_handle_at": raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0),
		"name_to_handle_at": raw(unix.SYS_NAME_TO_HANDLE_AT, uintptr(unix.AT_FDCWD&0xffffffff), 0, 0, 0, 0),
		"kexec_load":        raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0xffffffff),
		"kexec_file_load":   raw(unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0xffffffff),
		"init_module":       raw(unix.SYS_INIT_MODULE, 0, 0, 0),
		"finit_module":      raw(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0xffffffff),
		"delete_module":     raw(unix.SYS_DELETE_MODULE, c("condfs_no_such_module"), 0),
		"fanotify_init":     raw(unix.SYS_FANOTIFY_INIT, 0xffffffff, 0),
		"quotactl":          raw(unix.SYS_QUOTACTL, 0, 0, 0, 0),
		"quotactl_fd":       raw(unix.SYS_QUOTACTL_FD, ^uintptr(0), 0, 0, 0),
		"swapon":            raw(unix.SYS_SWAPON, c("/nonexistent"), 0),
		"swapoff":           raw(unix.SYS_SWAPOFF, c("/nonexistent")),
		"reboot":            raw(unix.SYS_REBOOT, 0, 0, 0, 0),
		"settimeofday":      raw(unix.SYS_SETTIMEOFDAY, 0, 0),
		"clock_settime":     raw(unix.SYS_CLOCK_SETTIME, 0xffff, 0),
		"clock_adjtime":     raw(unix.SYS_CLOCK_ADJTIME, 0xffff, 0),
		"adjtimex":          raw(unix.SYS_ADJTIMEX, 0),
		"acct":              raw(unix.SYS_ACCT, c("/nonexistent")),
		"lookup_dcookie":    raw(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0),
		"vhangup":           0,                              // filled below only when refused: a real vhangup would hang up our tty
		"syslog":            raw(unix.SYS_SYSLOG, 10, 0, 0), // SYSLOG_ACTION_SIZE_BUFFER
		"memfd_create":      raw(unix.SYS_MEMFD_CREATE, uintptr(unsafe.Pointer(&memfdName[0])), 0),
		"memfd_secret":      raw(unix.SYS_MEMFD_SECRET, 0),
		"fsopen":            raw(unix.SYS_FSOPEN, c("condfs-no-such-fs"), 0),
		"fsconfig":          raw(unix.SYS_FSCONFIG, ^uintptr(0), 0, 0, 0, 0),
		"fsmount":           raw(unix.SYS_FSMOUNT, ^uintptr(0), 0, 0),
		"fspick":            raw(unix.SYS_FSPICK, ^uintptr(0), 0, 0),
		"move_mount":        raw(unix.SYS_MOVE_MOUNT, ^uintptr(0), 0, ^uintptr(0), 0, 0),
		"open_tree":         raw(unix.SYS_OPEN_TREE, ^uintptr(0), 0, 0),
		"mount_setattr":     raw(unix.SYS_MOUNT_SETATTR, ^uintptr(0), 0, 0, 0, 0),
		"ioctl_TIOCSTI":     raw(unix.SYS_IOCTL, 0, unix.TIOCSTI, chp),
		"ioctl_TIOCSTI_hi":  raw(unix.SYS_IOCTL, 0, 1<<32|unix.TIOCSTI, chp),
		"ioctl_TIOCLINUX":   raw(unix.SYS_IOCTL, 0, unix.TIOCLINUX, chp),
		"clone3":            raw(unix.SYS_CLONE3, 0, 0),
		"x32_getpid":        raw(unix.SYS_GETPID | 0x40000000),
	}
	// vhangup only without a controlling terminal: unconfined, it would
	// hang up the test's terminal.
	if f, err := os.Open("/dev/tty"); err != nil {
		m["vhangup"] = raw(unix.SYS_VHANGUP)
	} else {
		f.Close()
		m["vhangup"] = -2
	}
	for k, v := range families() {
		m[k] = v
	}
	for name, flags := range map[string]uintptr{"clone_newuser": unix.CLONE_NEWUSER, "clone_newns": unix.CLONE_NEWNS, "clone_newnet": unix.CLONE_NEWNET, "clone_newpid": unix.CLONE_NEWPID} {
		m[name] = cloneFlags(flags)
	}
	return m
}

// families tries socket families the filter refuses, and two it allows.
func families() map[string]int {
	var pair [2]int32
	return map[string]int{
		// Families other than unix, inet, inet6 and netlink: a network
		// namespace does not isolate vsock (the host's port space, the
		// hypervisor at CID 2).
		"socket_vsock":     raw(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0),
		"socket_bluetooth": raw(unix.SYS_SOCKET, unix.AF_BLUETOOTH, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0),
		"socketpair_tipc":  raw(unix.SYS_SOCKETPAIR, unix.AF_TIPC, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, uintptr(unsafe.Pointer(&pair[0]))),
		"socket_inet":      raw(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0),
		"socketpair_unix":  raw(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, uintptr(unsafe.Pointer(&pair[0]))),
	}
}

// cloneFlags calls clone(flags|SIGCHLD) like fork; a child, should there
// be one, exits at once.
func cloneFlags(flags uintptr) int {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, _, e := syscall.RawSyscall6(unix.SYS_CLONE, flags|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return int(e)
	}
	if pid == 0 {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	return 0
}

func i386Getpid() int {
	r := int32(int80(20, 0, 0, 0)) // __NR_getpid on i386
	if r < 0 && r > -4096 {
		return int(-r)
	}
	return 0
}

// allowed does ordinary program work: a pipe, threads, fork and exec.
func allowed() map[string]int {
	m := map[string]int{}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		m["pipe"] = errno(err)
	} else {
		unix.Write(p[1], []byte("x"))
		b := make([]byte, 1)
		_, err := unix.Read(p[0], b)
		m["pipe"] = errno(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	tids := map[int]bool{}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // forces threads of their own
			mu.Lock()
			tids[unix.Gettid()] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	m["threads"] = len(tids)
	self, _ := os.Executable()
	m["fork_exec"] = errno(exec.Command(self, "true").Run())
	m["ioctl_TCGETS"] = raw(unix.SYS_IOCTL, 0, unix.TCGETS, uintptr(unsafe.Pointer(&unix.Termios{})))
	return m
}

func status() map[string]string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || k == "Seccomp" || k == "Uid" || k == "Gid" || k == "Groups") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func main() {
	var out any
	switch os.Args[1] {
	case "true":
		return
	case "refused":
		out = refused()
	case "allowed":
		out = allowed()
	case "int80":
		// Its own command: where the kernel has no i386 entry, int $0x80
		// faults and this process dies of SIGSEGV.
		out = map[string]int{"i386_getpid": i386Getpid()}
	case "status":
		out = status()
	case "exec":
		err := syscall.Exec(os.Args[2], os.Args[2:], os.Environ())
		out = map[string]int{"exec": errno(err)}
	case "write":
		f, err := os.OpenFile(os.Args[2], os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err == nil {
			_, err = f.WriteString("x")
			f.Close()
		}
		out = map[string]int{"write": errno(err)}
	case "read":
		_, err := os.ReadFile(os.Args[2])
		out = map[string]int{"read": errno(err)}
	default:
		fmt.Fprintln(os.Stderr, "probe: unknown command", os.Args[1])
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
}

var memfdName = []byte("probe\x00")
