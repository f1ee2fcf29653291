package confine

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run evaluates the filter on one syscall the way the kernel would. The
// x/net/bpf VM loads words big-endian, so each 32-bit field is stored
// big-endian at the offset the filter loads it from (seccomp_data is native,
// little-endian: an argument's low word comes first).
func run(t *testing.T, vm *bpf.VM, auditArch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], auditArch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[16+8*i+4:], uint32(a>>32))
	}
	v, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

// TestFilterProgram checks every decision of the filter, independently of
// capabilities and of which ABIs this kernel has.
const sigchld = uint64(unix.SIGCHLD)

func TestFilterProgram(t *testing.T) {
	insts, err := buildFilter()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	x86 := uint32(unix.AUDIT_ARCH_X86_64)
	nr := func(name string) uint32 {
		n, ok := arch.X86_64.SyscallNames[name]
		if !ok {
			t.Fatalf("no syscall %s", name)
		}
		return uint32(n)
	}
	for _, sc := range refusedEPERM {
		// go-seccomp-bpf's table is the independent word on the numbers.
		if n := nr(sc.name); n != sc.nr {
			t.Errorf("%s is %d, go-seccomp-bpf says %d", sc.name, sc.nr, n)
		}
		if got := run(t, vm, x86, sc.nr); got != retEPERM {
			t.Errorf("%s: %#x, want EPERM", sc.name, got)
		}
	}
	// Every other syscall of the ABI is allowed.
	for name, n := range arch.X86_64.SyscallNames {
		if slices.ContainsFunc(refusedEPERM, func(sc syscallNr) bool { return sc.name == name }) ||
			name == "clone" || name == "clone3" || name == "socket" || name == "socketpair" {
			continue
		}
		if got := run(t, vm, x86, uint32(n), 0, 0); got != retAllow {
			t.Errorf("%s: %#x, want allow", name, got)
		}
	}
	cases := []struct {
		what string
		nr   uint32
		args []uint64
		arch uint32
		want uint32
	}{
		{"clone3", nr("clone3"), nil, x86, retENOSYS},
		{"clone fork", nr("clone"), []uint64{sigchld}, x86, retAllow},
		{"clone vfork (os/exec)", nr("clone"), []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | sigchld}, x86, retAllow},
		{"clone thread", nr("clone"), []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM}, x86, retAllow},
		{"clone NEWUSER", nr("clone"), []uint64{unix.CLONE_NEWUSER | sigchld}, x86, retEPERM},
		{"clone NEWNS", nr("clone"), []uint64{unix.CLONE_NEWNS}, x86, retEPERM},
		{"clone NEWPID", nr("clone"), []uint64{unix.CLONE_NEWPID}, x86, retEPERM},
		{"clone NEWNET", nr("clone"), []uint64{unix.CLONE_NEWNET}, x86, retEPERM},
		{"clone NEWIPC", nr("clone"), []uint64{unix.CLONE_NEWIPC}, x86, retEPERM},
		{"clone NEWUTS", nr("clone"), []uint64{unix.CLONE_NEWUTS}, x86, retEPERM},
		{"clone NEWCGROUP", nr("clone"), []uint64{unix.CLONE_NEWCGROUP}, x86, retEPERM},
		{"clone NEWUSER high bits", nr("clone"), []uint64{1<<40 | unix.CLONE_NEWUSER}, x86, retEPERM},
		{"ioctl TIOCSTI", nr("ioctl"), []uint64{0, unix.TIOCSTI}, x86, retEPERM},
		{"ioctl TIOCSTI high bits", nr("ioctl"), []uint64{0, 0xffffffff00000000 | unix.TIOCSTI}, x86, retEPERM},
		{"ioctl TIOCLINUX", nr("ioctl"), []uint64{0, unix.TIOCLINUX}, x86, retEPERM},
		{"ioctl TIOCLINUX high bits", nr("ioctl"), []uint64{0, 1<<32 | unix.TIOCLINUX}, x86, retEPERM},
		{"ioctl TCGETS", nr("ioctl"), []uint64{0, unix.TCGETS}, x86, retAllow},
		{"ioctl TIOCGWINSZ", nr("ioctl"), []uint64{0, unix.TIOCGWINSZ}, x86, retAllow},
		{"mmap file read+exec (a library)", nr("mmap"), []uint64{0, 4096, unix.PROT_READ | unix.PROT_EXEC, unix.MAP_PRIVATE}, x86, retAllow},
		{"mmap anonymous read+write", nr("mmap"), []uint64{0, 4096, unix.PROT_READ | unix.PROT_WRITE, unix.MAP_PRIVATE | unix.MAP_ANONYMOUS}, x86, retAllow},
		{"mmap anonymous exec", nr("mmap"), []uint64{0, 4096, unix.PROT_READ | unix.PROT_EXEC, unix.MAP_PRIVATE | unix.MAP_ANONYMOUS}, x86, retEPERM},
		{"mmap file write+exec", nr("mmap"), []uint64{0, 4096, unix.PROT_WRITE | unix.PROT_EXEC, unix.MAP_PRIVATE}, x86, retEPERM},
		{"mmap anonymous exec high bits", nr("mmap"), []uint64{0, 4096, 1<<40 | unix.PROT_EXEC, 1<<40 | unix.MAP_ANONYMOUS}, x86, retEPERM},
		{"mprotect read", nr("mprotect"), []uint64{0, 4096, unix.PROT_READ}, x86, retAllow},
		{"mprotect exec", nr("mprotect"), []uint64{0, 4096, unix.PROT_READ | unix.PROT_EXEC}, x86, retEPERM},
		{"pkey_mprotect exec", nr("pkey_mprotect"), []uint64{0, 4096, unix.PROT_EXEC, 0}, x86, retEPERM},
		{"setsockopt SO_PASSRIGHTS", nr("setsockopt"), []uint64{0, unix.SOL_SOCKET, unix.SO_PASSRIGHTS}, x86, retEPERM},
		{"setsockopt SO_PASSRIGHTS high bits", nr("setsockopt"), []uint64{0, 1<<32 | unix.SOL_SOCKET, 1<<32 | unix.SO_PASSRIGHTS}, x86, retEPERM},
		{"setsockopt SO_RCVBUF", nr("setsockopt"), []uint64{0, unix.SOL_SOCKET, unix.SO_RCVBUF}, x86, retAllow},
		{"setsockopt IPPROTO_TCP, optname 83", nr("setsockopt"), []uint64{0, unix.IPPROTO_TCP, unix.SO_PASSRIGHTS}, x86, retAllow},
		{"shmat", nr("shmat"), []uint64{0, 0, 0}, x86, retAllow},
		{"shmat SHM_EXEC", nr("shmat"), []uint64{0, 0, shmExec}, x86, retEPERM},
		{"personality query", nr("personality"), []uint64{personaQuery}, x86, retAllow},
		{"personality linux", nr("personality"), []uint64{0}, x86, retAllow},
		{"personality READ_IMPLIES_EXEC", nr("personality"), []uint64{readImpliesExec}, x86, retEPERM},
		{"socket AF_VSOCK", nr("socket"), []uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, x86, retEAFNOSUPPORT},
		{"socket AF_VSOCK high bits", nr("socket"), []uint64{1<<32 | unix.AF_VSOCK, unix.SOCK_STREAM}, x86, retEAFNOSUPPORT},
		{"socket AF_INET high bits (the kernel reads an int)", nr("socket"), []uint64{1<<32 | unix.AF_INET, unix.SOCK_STREAM}, x86, retAllow},
		{"socketpair AF_UNIX", nr("socketpair"), []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, x86, retAllow},
		{"socketpair AF_TIPC", nr("socketpair"), []uint64{unix.AF_TIPC, unix.SOCK_STREAM}, x86, retEAFNOSUPPORT},
		{"read", nr("read"), nil, x86, retAllow},
		{"openat", nr("openat"), nil, x86, retAllow},
		{"execve", nr("execve"), nil, x86, retAllow},
		{"x32 getpid", nr("getpid") | 0x40000000, nil, x86, retENOSYS},
		{"x32 mount", nr("mount") | 0x40000000, nil, x86, retENOSYS},
		{"x32 ioctl", 514 | 0x40000000, []uint64{0, unix.TIOCSTI}, x86, retENOSYS},
		{"i386 getpid", 20, nil, unix.AUDIT_ARCH_I386, retENOSYS},
		{"i386 mount", 21, nil, unix.AUDIT_ARCH_I386, retENOSYS},
		{"i386 ioctl TIOCSTI", 54, []uint64{0, unix.TIOCSTI}, unix.AUDIT_ARCH_I386, retENOSYS},
		{"aarch64 read", 63, nil, unix.AUDIT_ARCH_AARCH64, retENOSYS},
	}
	// Of every address family, socket and socketpair create only these.
	for _, name := range []string{"socket", "socketpair"} {
		for f := uint64(0); f <= unix.AF_MAX; f++ {
			want := uint32(retEAFNOSUPPORT)
			if f == unix.AF_UNIX || f == unix.AF_INET || f == unix.AF_INET6 || f == unix.AF_NETLINK {
				want = retAllow
			}
			if got := run(t, vm, x86, nr(name), f, unix.SOCK_STREAM); got != want {
				t.Errorf("%s family %d: %#x, want %#x", name, f, got, want)
			}
		}
	}
	for _, c := range cases {
		if got := run(t, vm, c.arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.what, got, c.want)
		}
	}
}
