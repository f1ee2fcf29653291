package confine

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// syscallNr is a syscall of the x86-64 ABI, by name and number.
type syscallNr struct {
	name string
	nr   uint32
}

// refusedEPERM are refused outright with EPERM (see the package doc).
var refusedEPERM = []syscallNr{
	{"mount", unix.SYS_MOUNT}, {"umount2", unix.SYS_UMOUNT2}, {"pivot_root", unix.SYS_PIVOT_ROOT}, {"chroot", unix.SYS_CHROOT}, {"unshare", unix.SYS_UNSHARE}, {"setns", unix.SYS_SETNS},
	{"ptrace", unix.SYS_PTRACE}, {"process_vm_readv", unix.SYS_PROCESS_VM_READV}, {"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"bpf", unix.SYS_BPF}, {"perf_event_open", unix.SYS_PERF_EVENT_OPEN}, {"userfaultfd", unix.SYS_USERFAULTFD},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP}, {"io_uring_enter", unix.SYS_IO_URING_ENTER}, {"io_uring_register", unix.SYS_IO_URING_REGISTER},
	{"keyctl", unix.SYS_KEYCTL}, {"add_key", unix.SYS_ADD_KEY}, {"request_key", unix.SYS_REQUEST_KEY},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT}, {"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	{"kexec_load", unix.SYS_KEXEC_LOAD}, {"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD}, {"init_module", unix.SYS_INIT_MODULE}, {"finit_module", unix.SYS_FINIT_MODULE}, {"delete_module", unix.SYS_DELETE_MODULE},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT}, {"quotactl", unix.SYS_QUOTACTL}, {"quotactl_fd", unix.SYS_QUOTACTL_FD}, {"swapon", unix.SYS_SWAPON}, {"swapoff", unix.SYS_SWAPOFF}, {"reboot", unix.SYS_REBOOT},
	{"settimeofday", unix.SYS_SETTIMEOFDAY}, {"clock_settime", unix.SYS_CLOCK_SETTIME}, {"clock_adjtime", unix.SYS_CLOCK_ADJTIME}, {"adjtimex", unix.SYS_ADJTIMEX},
	{"acct", unix.SYS_ACCT}, {"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE}, {"vhangup", unix.SYS_VHANGUP}, {"syslog", unix.SYS_SYSLOG},
	{"fsopen", unix.SYS_FSOPEN}, {"fsconfig", unix.SYS_FSCONFIG}, {"fsmount", unix.SYS_FSMOUNT}, {"fspick", unix.SYS_FSPICK}, {"move_mount", unix.SYS_MOVE_MOUNT}, {"open_tree", unix.SYS_OPEN_TREE}, {"mount_setattr", unix.SYS_MOUNT_SETATTR},
	// A memfd lives on the kernel's internal shmem mount, which is not
	// noexec and which Landlock does not govern: a copy of any program
	// written into one ran (execveat, or the loader on /proc/self/fd/N).
	{"memfd_create", unix.SYS_MEMFD_CREATE}, {"memfd_secret", unix.SYS_MEMFD_SECRET},
}

// Memory that is both written and executed: an ELF handed to the
// interpreter from a noexec place (/tmp) had ld.so map one segment
// anonymous and executable, write its code there with relocations and jump
// to it; a library's pages could be mapped writable and executable too.
// So no mapping is writable and executable, no anonymous mapping is
// executable, and mprotect never adds execution (seccomp cannot see what it
// removes): every executable page comes from a file of an exec mount, which
// the run holds read-only. JITs cannot run (docs/sandbox.md).
const (
	readImpliesExec = 0x0400000 // personality(2): PROT_READ then implies PROT_EXEC
	personaQuery    = 0xffffffff
	shmExec         = 0o100000 // SHM_EXEC
)

// cloneNewFlags are the namespace flags clone(2) accepts in its first
// argument (CLONE_NEWTIME only goes through clone3, refused whole).
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// socketFamilies are the address families socket(2) and socketpair(2)
// may create; any other answers EAFNOSUPPORT, as from a kernel without it.
// A network namespace isolates these four (netlink: the run's own, which
// glibc's getaddrinfo reads); it does not isolate every family: a run
// could bind AF_VSOCK ports of the host's own port space and reach the
// hypervisor (CID 2) with no decision.
var socketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

const (
	retAllow        = unix.SECCOMP_RET_ALLOW
	retEPERM        = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS       = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retEAFNOSUPPORT = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)

	// Offsets in struct seccomp_data (little endian).
	offNr       = 0
	offArch     = 4
	offArg0Low  = 16
	offArg1Low  = 16 + 8*1
	offArg2Low  = 16 + 8*2
	offArg3Low  = 16 + 8*3
	auditArchX8 = unix.AUDIT_ARCH_X86_64

	// x32SyscallBit marks a syscall number of the x32 ABI, which runs
	// under AUDIT_ARCH_X86_64.
	x32SyscallBit = 0x40000000
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

// buildFilter returns the filter, written here with x/net/bpf rather than
// with a policy library: the policy is a fixed list, and go-seccomp-bpf's
// syscall tables cost every condfs process (each `condfs run` client and
// sandbox init) 0.3 ms of package initialisation. Its shape: a foreign arch
// or an x32 number is ENOSYS; ioctl and clone are decided on their
// arguments' low 32 bits (the kernel reads ioctl's request as unsigned int;
// every namespace flag of clone is below bit 32); clone3 is ENOSYS; each
// refused number is EPERM; mmap, mprotect, pkey_mprotect, shmat and
// personality are decided on their protection or flags (W^X, above);
// socket and socketpair on their family (socketFamilies); everything else
// is allowed. The kernel's seccomp action cache then skips
// the filter for every allowed syscall but those decided on arguments.
func buildFilter() ([]bpf.Instruction, error) {
	var f filter
	f.load(offArch)
	f.jumps = append(f.jumps, jump{len(f.prog), toENOSYS, false})
	f.prog = append(f.prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX8})
	f.load(offNr)
	f.cond(bpf.JumpGreaterOrEqual, x32SyscallBit, toENOSYS)
	// Each syscall decided on its arguments jumps to its checks (their
	// targets are set once the checks are laid out, below).
	entries := make([][]int, len(argChecks))
	for i, c := range argChecks {
		for _, nr := range c.nrs {
			entries[i] = append(entries[i], f.cond(bpf.JumpEqual, nr, 0))
		}
	}
	f.cond(bpf.JumpEqual, unix.SYS_CLONE3, toENOSYS)
	for _, sc := range refusedEPERM {
		f.cond(bpf.JumpEqual, sc.nr, toEPERM)
	}
	f.ret(retAllow)
	for i, c := range argChecks {
		for _, j := range entries[i] {
			f.jumps[j].to = len(f.prog)
		}
		c.check(&f)
	}
	allow := len(f.prog)
	f.ret(retAllow)
	f.ret(retEPERM)
	f.ret(retENOSYS)
	return resolveJumps(f.prog, f.jumps, allow, toAllow)
}

// Jump targets of the filter: the three returns at its end.
const (
	toAllow = -1 - iota
	toEPERM
	toENOSYS
)

// filter is a filter being laid out: its instructions, and its
// conditional jumps, whose skips resolveJumps sets.
type filter struct {
	prog  []bpf.Instruction
	jumps []jump
}

// cond appends a test that goes to `to` when it holds (and falls through
// otherwise), and returns its index among the jumps.
func (f *filter) cond(test bpf.JumpTest, val uint32, to int) int {
	f.jumps = append(f.jumps, jump{len(f.prog), to, true})
	f.prog = append(f.prog, bpf.JumpIf{Cond: test, Val: val})
	return len(f.jumps) - 1
}

// load loads the 32 bits of struct seccomp_data at off.
func (f *filter) load(off uint32) { f.prog = append(f.prog, bpf.LoadAbsolute{Off: off, Size: 4}) }

func (f *filter) ret(v uint32) { f.prog = append(f.prog, bpf.RetConstant{Val: v}) }

// argChecks are the syscalls decided on their arguments, each with its
// checks, which end in a return.
var argChecks = []struct {
	nrs   []uint32
	check func(*filter)
}{
	// ioctl(fd, request): the kernel reads request as unsigned int.
	{[]uint32{unix.SYS_IOCTL}, func(f *filter) {
		f.load(offArg1Low)
		f.cond(bpf.JumpEqual, unix.TIOCSTI, toEPERM)
		f.cond(bpf.JumpEqual, unix.TIOCLINUX, toEPERM)
		f.ret(retAllow)
	}},
	// clone(flags, ...): every namespace flag is below bit 32.
	{[]uint32{unix.SYS_CLONE}, func(f *filter) {
		f.load(offArg0Low)
		f.cond(bpf.JumpBitsSet, cloneNewFlags, toEPERM)
		f.ret(retAllow)
	}},
	// mmap(addr, len, prot, flags, ...): executable and writable, or
	// executable and anonymous, is refused.
	{[]uint32{unix.SYS_MMAP}, func(f *filter) {
		f.load(offArg2Low)
		f.jumps = append(f.jumps, jump{len(f.prog), toAllow, false})
		f.prog = append(f.prog, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.PROT_EXEC})
		f.cond(bpf.JumpBitsSet, unix.PROT_WRITE, toEPERM)
		f.load(offArg3Low)
		f.cond(bpf.JumpBitsSet, unix.MAP_ANONYMOUS, toEPERM)
		f.ret(retAllow)
	}},
	// mprotect and pkey_mprotect(addr, len, prot): never to executable.
	{[]uint32{unix.SYS_MPROTECT, unix.SYS_PKEY_MPROTECT}, func(f *filter) {
		f.load(offArg2Low)
		f.cond(bpf.JumpBitsSet, unix.PROT_EXEC, toEPERM)
		f.ret(retAllow)
	}},
	// setsockopt(fd, level, optname, ...): no SO_PASSRIGHTS (no stdio is
	// a socket now, so this only keeps the command from changing what a
	// socket it holds accepts). The kernel reads level and optname as
	// ints.
	{[]uint32{unix.SYS_SETSOCKOPT}, func(f *filter) {
		f.load(offArg1Low)
		f.cond(bpf.JumpNotEqual, unix.SOL_SOCKET, toAllow)
		f.load(offArg2Low)
		f.cond(bpf.JumpEqual, unix.SO_PASSRIGHTS, toEPERM)
		f.ret(retAllow)
	}},
	// shmat(id, addr, flags): no executable System V segment.
	{[]uint32{unix.SYS_SHMAT}, func(f *filter) {
		f.load(offArg2Low)
		f.cond(bpf.JumpBitsSet, shmExec, toEPERM)
		f.ret(retAllow)
	}},
	// personality(persona): not READ_IMPLIES_EXEC (a query is allowed).
	{[]uint32{unix.SYS_PERSONALITY}, func(f *filter) {
		f.load(offArg0Low)
		f.cond(bpf.JumpEqual, personaQuery, toAllow)
		f.cond(bpf.JumpBitsSet, readImpliesExec, toEPERM)
		f.ret(retAllow)
	}},
	// socket and socketpair(domain, ...): only socketFamilies (the kernel
	// reads domain as int: the low 32 bits).
	{[]uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR}, func(f *filter) {
		f.load(offArg0Low)
		for _, fam := range socketFamilies {
			f.cond(bpf.JumpEqual, fam, toAllow)
		}
		f.ret(retEAFNOSUPPORT)
	}},
}

// jump is a conditional jump of the filter whose target is set once the
// program is laid out.
type jump struct {
	at, to int // instruction index; target index, or first-1-k for the k-th return at the end
	onTrue bool
}

// resolveJumps sets each jump's skip: to its target index, or to one of
// the returns that start at allow (a target of first, first-1, ...).
func resolveJumps(prog []bpf.Instruction, jumps []jump, allow, first int) ([]bpf.Instruction, error) {
	for _, j := range jumps {
		to := j.to
		if to < 0 {
			to = allow + (first - to)
		}
		skip := to - (j.at + 1)
		if skip < 0 || skip > 255 {
			return nil, fmt.Errorf("confine: seccomp: jump from %d to %d out of range", j.at, to)
		}
		in := prog[j.at].(bpf.JumpIf)
		if j.onTrue {
			in.SkipTrue = uint8(skip)
		} else {
			in.SkipFalse = uint8(skip)
		}
		prog[j.at] = in
	}
	return prog, nil
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
