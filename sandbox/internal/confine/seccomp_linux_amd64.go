package confine

import (
	"fmt"
	"sync"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// refusedEPERM are refused outright with EPERM (see the package doc).
var refusedEPERM = []string{
	"mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
	"ptrace", "process_vm_readv", "process_vm_writev",
	"bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"keyctl", "add_key", "request_key",
	"open_by_handle_at", "name_to_handle_at",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"fanotify_init", "quotactl", "quotactl_fd", "swapon", "swapoff", "reboot",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"acct", "lookup_dcookie", "vhangup", "syslog",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	// A memfd lives on the kernel's internal shmem mount, which is not
	// noexec and which Landlock does not govern: a copy of any program
	// written into one ran (execveat, or the loader on /proc/self/fd/N).
	"memfd_create", "memfd_secret",
}

// cloneNewFlags are the namespace flags clone(2) accepts in its first
// argument (CLONE_NEWTIME only goes through clone3, refused whole).
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)

	// Offsets in struct seccomp_data (little endian).
	offNr       = 0
	offArch     = 4
	offArg1Low  = 16 + 8*1
	auditArchX8 = unix.AUDIT_ARCH_X86_64
)

// filterProgram is the filter in the kernel's form, built once: the policy
// is fixed.
var filterProgram = sync.OnceValues(func() ([]unix.SockFilter, error) {
	insts, err := buildFilter()
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("confine: seccomp: assemble: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		prog[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return prog, nil
})

// buildFilter returns the filter: this package's arch and ioctl checks
// first, then go-seccomp-bpf's program for the rest. go-seccomp-bpf sends a
// foreign arch to the default action (allow) and compares arguments on 64
// bits, which a truncated ioctl request would slip past; the prefix refuses
// both before the library's program runs. Jumps in BPF are relative, so the
// library's program is unchanged by what comes before it.
func buildFilter() ([]bpf.Instruction, error) {
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Names: refusedEPERM, Action: seccomp.Action(retEPERM)},
			{Names: []string{"clone3"}, Action: seccomp.Action(retENOSYS)},
			{
				NamesWithCondtions: []seccomp.NameWithConditions{{
					Name: "clone",
					Conditions: seccomp.ArgumentConditions{{
						Argument: 0, Operation: seccomp.BitsSet, Value: cloneNewFlags,
					}},
				}},
				Action: seccomp.Action(retEPERM),
			},
		},
	}
	lib, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("confine: seccomp: assemble policy: %w", err)
	}
	prefix := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX8, SkipTrue: 1},
		bpf.RetConstant{Val: retENOSYS},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_IOCTL, SkipFalse: 4},
		bpf.LoadAbsolute{Off: offArg1Low, Size: 4}, // the kernel reads cmd as unsigned int
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCSTI, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCLINUX, SkipFalse: 1},
		bpf.RetConstant{Val: retEPERM},
	}
	return append(prefix, lib...), nil
}

// loadSeccomp installs the filter on this thread only (no TSYNC flag).
func loadSeccomp() error {
	prog, err := filterProgram()
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("confine: seccomp: load filter: %w", e)
	}
	return nil
}
