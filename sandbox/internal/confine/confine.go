package confine

// Config says what the confined thread's children may still do.
type Config struct {
	// ExecPaths are files, or directories beneath which files, may be
	// executed. The ELF interpreter file (/lib64/ld-linux-x86-64.so.2 and
	// what it resolves to) must be listed for dynamic programs to start.
	ExecPaths []string
	// WritePaths are directories beneath which files may be written,
	// created, removed and renamed, or single files (device nodes such as
	// /dev/null and /dev/tty) that may be written.
	WritePaths []string
	// ReadPaths are files or directories beneath which files may be read
	// ("/" is fine).
	ReadPaths []string
	// RequireLandlock makes Apply fail when the kernel has no Landlock
	// instead of going on without it.
	RequireLandlock bool
	// KeepSetID leaves CAP_SETUID and CAP_SETGID in the thread's permitted
	// and effective sets, so that a forked child can switch to the owner's
	// uid and groups (os/exec Credential); the switch from uid 0 clears
	// them. False: the sets are empty.
	KeepSetID bool
}

// Report says which protections are in force (Apply) or available (Probe).
type Report struct {
	// Landlock is the Landlock ABI version in force or available, 0 for none.
	Landlock int
	// Seccomp is true when the seccomp filter is in force or available.
	Seccomp bool
	// NoNewPrivs is true when no_new_privs is set or can be.
	NoNewPrivs bool
}
