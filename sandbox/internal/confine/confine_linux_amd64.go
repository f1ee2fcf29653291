package confine

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Apply confines the calling OS thread; see the package doc for what and in
// which order. The caller holds runtime.LockOSThread and never releases it.
// On error the thread is partly confined and must not be used for anything
// but reporting the error.
func Apply(c Config) (Report, error) {
	var r Report
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return r, fmt.Errorf("confine: clear ambient capabilities: %w", err)
	}
	if err := dropBounding(); err != nil {
		return r, err
	}
	if err := setCaps(c.KeepSetID); err != nil {
		return r, err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return r, fmt.Errorf("confine: set no_new_privs: %w", err)
	}
	r.NoNewPrivs = true
	abi, err := restrictLandlock(c)
	if err != nil {
		return r, err
	}
	r.Landlock = abi
	if err := loadSeccomp(); err != nil {
		return r, err
	}
	r.Seccomp = true
	return r, nil
}

// Probe reports what this kernel offers.
func Probe() Report {
	var r Report
	r.Landlock = landlockABI()
	r.Seccomp = seccompSupported()
	_, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	r.NoNewPrivs = err == nil
	return r
}

// seccompSupported: the seccomp syscall exists and takes filters. Strict
// mode refuses any flag, so asking for it with one answers EINVAL where
// seccomp is there, and changes nothing.
func seccompSupported() bool {
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_STRICT, 1, 0)
	return e == unix.EINVAL
}

// lastCap is the highest capability number the kernel knows. It asks
// /proc first and, where /proc is absent, the bounding set itself.
func lastCap() (int, error) {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n < 0 || n > 63 {
			return 0, fmt.Errorf("confine: bounding set: bad cap_last_cap %q", b)
		}
		return n, nil
	}
	for n := 0; n < 64; n++ {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(n), 0, 0, 0); errors.Is(err, unix.EINVAL) {
			if n == 0 {
				break
			}
			return n - 1, nil
		}
	}
	return 0, errors.New("confine: bounding set: cannot tell the last capability")
}

func dropBounding() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for n := 0; n <= last; n++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(n), 0, 0, 0); err != nil {
			return fmt.Errorf("confine: bounding set: drop capability %d: %w", n, err)
		}
	}
	// A capability above a stale cap_last_cap would survive: refuse.
	if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(last+1), 0, 0, 0); !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("confine: bounding set: capability %d exists beyond cap_last_cap", last+1)
	}
	return nil
}

func setCaps(keepSetID bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3} // Pid 0: this thread
	var data [2]unix.CapUserData
	if keepSetID {
		m := uint32(1)<<unix.CAP_SETUID | uint32(1)<<unix.CAP_SETGID
		data[0].Permitted, data[0].Effective = m, m
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("confine: capset: %w", err)
	}
	return nil
}

// landlockABI is the kernel's Landlock ABI, capped at the newest one
// go-landlock knows (its rights are the ones this package can name), 0 when
// Landlock is absent or disabled.
func landlockABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil || v < 1 {
		return 0
	}
	return min(v, len(abiConfigs))
}

var abiConfigs = []landlock.Config{
	landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5, landlock.V6,
	landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11,
}

const (
	fsRead  = landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSReadDir)
	fsExec  = landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir)
	fsWrite = landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSWriteFile |
		ll.AccessFSTruncate | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeDir |
		ll.AccessFSMakeReg | ll.AccessFSMakeSym | ll.AccessFSMakeFifo | ll.AccessFSMakeSock |
		ll.AccessFSRefer | ll.AccessFSIoctlDev)
	// fsFileOnly are the rights the kernel accepts on a rule for a
	// non-directory.
	fsFileOnly = landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile |
		ll.AccessFSTruncate | ll.AccessFSIoctlDev)
)

// restrictLandlock enforces the ruleset on this thread only
// (landlock_restrict_self without TSYNC). go-landlock's Restrict* would
// enforce it on every thread (psx / AllThreadsSyscall below ABI 8, TSYNC
// from 8), so only its ruleset construction is used.
func restrictLandlock(c Config) (int, error) {
	abi := landlockABI()
	if abi == 0 {
		if c.RequireLandlock {
			return 0, errors.New("confine: landlock: the kernel has no Landlock (5.13+, enabled in the lsm= list) and it is required")
		}
		return 0, nil
	}
	handled := abiConfigs[abi-1].HandledAccessFS
	// Scoped (ABI 6 on): the command connects to no abstract Unix socket
	// and signals no process made outside its domain. A run sharing the
	// host's network reached a host process's abstract socket, which sent
	// it a file of an exec mount (SCM_RIGHTS) that it mapped executable
	// (TestHostNetworkAbstractSocketPassesNoDescriptors); and it could crash its init
	// with a signal (TestInitIgnoresCrashSignalsFromTheCommand).
	cfg := &landlock.Config{HandledAccessFS: handled, Scoped: abiConfigs[abi-1].Scoped}
	if !c.RequireLandlock {
		*cfg = cfg.BestEffort()
	}
	var rules []landlock.Rule
	for _, set := range []struct {
		paths  []string
		access landlock.AccessFSSet
	}{{c.ReadPaths, fsRead}, {c.ExecPaths, fsExec}, {c.WritePaths, fsWrite}} {
		for _, p := range set.paths {
			// The type from the kernel's cache (an inode's type never
			// changes): a FUSE filesystem is not asked, which would
			// answer as this thread's uid. A view admits its owner, not
			// the root that confines the thread for the owner's command.
			var stx unix.Statx_t
			if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &stx); err != nil {
				return 0, fmt.Errorf("confine: landlock: rule for %q: %w", p, err)
			}
			a := set.access & handled
			if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
				a &= fsFileOnly
			}
			if a != 0 {
				rules = append(rules, landlock.PathAccess(a, p))
			}
		}
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return 0, fmt.Errorf("confine: landlock: ruleset: %w", err)
	}
	if fd < 0 {
		// Only in best-effort mode, when the kernel lost Landlock
		// between the version query and the ruleset.
		if c.RequireLandlock {
			return 0, errors.New("confine: landlock: no ruleset to enforce")
		}
		return 0, nil
	}
	defer unix.Close(fd)
	if err := ll.LandlockRestrictSelf(fd, flags); err != nil {
		return 0, fmt.Errorf("confine: landlock: restrict self: %w", err)
	}
	return abi, nil
}
