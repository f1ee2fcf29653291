// Package stdiofd tells which descriptors a sandboxed command may be given
// as its stdio as they are.
//
// A command may map any descriptor it holds executable, or execute it
// through /proc/self/fd, wherever the descriptor's own mount allows: the
// run's noexec mounts say nothing of a file its caller opened elsewhere. A
// workspace file given as stdin through the host's view mount (mounted
// exec) ran as a program through the ELF interpreter, though no binaries
// entry listed it (TestStdinFileOnExecMountNeverExecutes); a socket carries descriptors
// and connections. So the daemon refuses such a descriptor as stdio, and
// condfs run gives the command a pipe in its place, copying between the
// two itself.
package stdiofd

import "golang.org/x/sys/unix"

// Relayed reports whether fd must reach a command through a pipe, not as
// it is: a regular file or a character device that is neither a terminal
// nor /dev/null (mappable: /dev/zero maps as shared memory), or a socket. A
// file on a noexec mount is no exception: a caller's own mount (in a user
// namespace of its own) can be made exec again after the check
// (TestStdinFileOfRemountedNoexecNeverMaps). A Unix socket carries descriptors both
// ways: the command sent a socket of its own out through one and received
// files of exec mounts back (TestStdinSocketPassesNoDescriptorsOut); an unconnected
// socket connects in its maker's network namespace
// (TestStdinInetSocketReachesNoNetwork). Pipes, terminals and /dev/null go as they
// are.
func Relayed(fd int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFSOCK:
		return true, nil
	case unix.S_IFCHR:
		if unix.Major(st.Rdev) == 1 && unix.Minor(st.Rdev) == 3 {
			return false, nil // /dev/null
		}
		_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		return err != nil, nil
	}
	return false, nil
}
