// Package confine confines the calling OS thread so that a program it then
// forks and executes (os/exec, from the same locked thread) inherits the
// confinement. The sandbox's init applies it just before it starts the
// command; everything here acts on one thread only, never through
// AllThreadsSyscall or TSYNC, because the process's other threads (the init's
// own work, and in a cgo-linked binary threads Go does not know of) must keep
// their authority.
//
// Apply, in order, fails closed and names the step that failed:
//
//  1. ambient capabilities cleared;
//  2. every capability dropped from the bounding set (0 to the last one the
//     kernel has), so no execve can grant one again;
//  3. capset: inheritable empty; permitted and effective empty, or only
//     CAP_SETUID and CAP_SETGID with KeepSetID, so that the forked child can
//     switch to the owner's uid and groups (os/exec Credential). A setuid from
//     0 to another uid clears both sets; an execve as uid 0 leaves them empty
//     too, since the bounding and inheritable sets are;
//  4. no_new_privs: setuid and file-capability bits grant nothing at execve;
//  5. Landlock (below);
//  6. a seccomp filter (below).
//
// # Seccomp
//
// The filter allows by default and refuses what a confined program never
// needs and what would let it leave its namespaces or reach the kernel's
// less exercised surfaces, with EPERM: mount, umount2, pivot_root, chroot,
// unshare, setns, clone with any CLONE_NEW* flag, ptrace,
// process_vm_readv/writev, bpf, perf_event_open, userfaultfd, io_uring_setup,
// io_uring_enter, io_uring_register, keyctl, add_key, request_key,
// open_by_handle_at, name_to_handle_at, kexec_load, kexec_file_load,
// init_module, finit_module, delete_module, fanotify_init, quotactl,
// quotactl_fd, swapon, swapoff, reboot, settimeofday, clock_settime,
// clock_adjtime, adjtimex, acct, lookup_dcookie, vhangup, syslog, the new
// mount API (fsopen, fsconfig, fsmount, fspick, move_mount, open_tree,
// mount_setattr), and ioctl with TIOCSTI or TIOCLINUX (terminal input
// injection). ioctl's request is an unsigned int to the kernel, so only its
// low 32 bits are compared: TIOCSTI with high bits set is refused as well.
// Also with EPERM, memory both written and executed (W^X): mmap executable
// and writable or executable and anonymous, mprotect and pkey_mprotect to
// executable, shmat with SHM_EXEC, and personality with READ_IMPLIES_EXEC
// (which would make every readable mapping executable). Every executable
// page then comes from a file of an exec mount, which a run holds
// read-only; JITs do not run.
//
// With ENOSYS: clone3 entirely (its flags live in memory a filter cannot
// read; glibc and Go fall back to clone, whose flags it can), and every
// syscall of a foreign ABI: an arch other than AUDIT_ARCH_X86_64 (i386
// through int $0x80) and x32 syscall numbers (bit 0x40000000). ENOSYS is the
// answer of a kernel built without that ABI, so a program sees an ABI that
// does not exist rather than one it may retry. The filter is assembled here
// (x/net/bpf) from the kernel's numbers in x/sys; the tests check each
// number against go-seccomp-bpf's table and every decision in a BPF
// interpreter.
//
// # Landlock
//
// The ruleset handles every filesystem right of the best Landlock ABI the
// kernel has (up to what go-landlock knows), and grants:
//
//   - ReadPaths: read files and list directories beneath;
//   - ExecPaths: execute (and read) the files named, or those beneath the
//     directories named. The kernel checks execute on the program and on its
//     ELF interpreter, so the interpreter file must be listed too;
//   - WritePaths: beneath a directory, read, write, truncate, create and
//     remove files, directories, symlinks, fifos and sockets, and rename or
//     link between such places (not device nodes). A file named (a device
//     node such as /dev/null or /dev/tty) may be read, written, truncated and
//     take device ioctls; devices the command must write belong here.
//
// Executing a file (execve) outside ExecPaths fails with EACCES, also as a
// script's interpreter. What Landlock does not restrict: mapping a file
// executable. The dynamic loader run on a program
// (/lib64/ld-linux-x86-64.so.2 /some/program) opens and maps it, so it
// executes any program it can read on a mount without noexec; the sandbox
// mounts every writable place noexec and shows only allowed programs in the
// bin directories, which closes that. Descriptors opened before Apply keep
// the rights they were opened with. Connecting to pathname Unix sockets made
// outside the domain is refused from ABI 9 on (never granted here).
// Without Landlock in the kernel, Apply goes on without it unless
// RequireLandlock is set; Report says what is in force.
//
// # Use
//
// Call Apply with runtime.LockOSThread held, start the command from that
// goroutine, and never unlock the thread: the runtime then ends it when the
// goroutine returns instead of reusing a confined thread. Threads the
// runtime creates while the goroutine is locked come from its template
// thread, not from the confined one, so they are not confined.
package confine
