// Command attacker makes the system calls the attack suite needs, run by
// the tests as an unprivileged uid (setpriv). Each subcommand prints what
// happened on stdout: the bytes read, or "errno NAME".
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: attacker creat|ioctl|cat|chmod|exchange|hold|mmap|flood PATH [ARG]")
		os.Exit(2)
	}
	p := os.Args[2]
	switch os.Args[1] {
	case "creat": // open(O_CREAT|O_RDWR) without O_EXCL, then read
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR, 0o600)
		if report(err) {
			return
		}
		readAll(fd)
	case "ioctl": // FS_IOC_GETFLAGS: harmless, but must never run as the daemon
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if report(err) {
			return
		}
		_, err = unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
		if !report(err) {
			fmt.Println("ioctl ran")
		}
	case "cat":
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if report(err) {
			return
		}
		readAll(fd)
	case "chmod":
		m, _ := strconv.ParseUint(os.Args[3], 8, 32)
		if !report(unix.Chmod(p, uint32(m))) {
			fmt.Println("chmod done")
		}
	case "exchange":
		if !report(unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, os.Args[3], unix.RENAME_EXCHANGE)) {
			fmt.Println("exchanged")
		}
	case "hold": // open, then on each line of stdin read from offset 0 (and write with "w")
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		if report(err) {
			return
		}
		fmt.Println("open")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "w" {
				_, err := unix.Pwrite(fd, []byte("W"), 0)
				if !report(err) {
					fmt.Println("wrote")
				}
				continue
			}
			buf := make([]byte, 4096)
			n, err := unix.Pread(fd, buf, 0)
			if !report(err) {
				fmt.Printf("read %q\n", buf[:n])
			}
		}
	case "runstdio": // runstdio SOCKET SESSION KIND SCRIPT (runstdio.go)
		runStdio(p, os.Args[3], os.Args[4], os.Args[5])
	case "mmap": // map MAP_SHARED and close the fd, then on each line of stdin read the mapping
		mapped(p)
	case "lock": // N waiters for an exclusive lock: lock PATH flock|posix|ofd N (lock.go)
		n, _ := strconv.Atoi(os.Args[4])
		waiters(p, os.Args[3], n)
	case "locker": // one descriptor, lock commands on stdin (lock.go)
		locker(p)
	case "shell": // one command per line on stdin, one answer line each
		shell(os.Stdin, os.Stdout)
	case "hold2":
		hold2(p, os.Args[3])
	case "mmapbig":
		mmapbig(p)
	case "dirhold":
		dirhold(p)
	case "race":
		th, _ := strconv.Atoi(os.Args[3])
		race(p, th, 0, os.Args[4])
	case "shell2":
		fmt.Println("ready")
		shell(os.Stdin, os.Stdout)
	case "flip":
		flip(p, os.Args[3])
	case "busy":
		th, _ := strconv.Atoi(os.Args[3])
		busy(p, th)
	case "flood": // flood SOCKET N: open N control connections and hold them
		flood(floodArgs())
	case "bigdecide": // bigdecide SOCKET CONNS ROUNDS: 1 MiB tool.decide requests (flood.go)
		n, _ := strconv.Atoi(os.Args[3])
		rounds, _ := strconv.Atoi(os.Args[4])
		bigDecide(os.Args[2], n, rounds)
	default:
		fmt.Fprintln(os.Stderr, "unknown subcommand")
		os.Exit(2)
	}
}

// shell runs commands for the model-based test: every answer is one line,
// "ok" with a quoted result, or "errno NAME".
func shell(in *os.File, out *os.File) {
	w := bufio.NewWriter(out)
	handles := map[string]int{}
	next := 0
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			fmt.Fprintln(w, "error bad command")
			w.Flush()
			continue
		}
		var res string
		var err error
		switch f[0] {
		case "cat":
			var b []byte
			b, err = os.ReadFile(f[1])
			res = string(b)
		case "stat": // lstat: the size, or the errno
			var st unix.Stat_t
			if err = unix.Lstat(f[1], &st); err == nil {
				res = strconv.FormatInt(st.Size, 10)
			}
		case "ls":
			var names []string
			d, derr := os.Open(f[1])
			if err = derr; err == nil {
				names, err = d.Readdirnames(-1)
				d.Close()
			}
			res = strings.Join(names, "/")
		case "creat":
			var fd int
			fd, err = unix.Open(f[1], unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644)
			if err == nil {
				unix.Write(fd, []byte(f[2]))
				unix.Close(fd)
			}
		case "lock": // a POSIX write lock, without waiting; released again
			var fd int
			fd, err = unix.Open(f[1], unix.O_RDWR, 0)
			if err == nil {
				err = unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0})
				unix.Close(fd)
			}
		case "mkdir":
			err = unix.Mkdir(f[1], 0o755)
		case "cd":
			err = unix.Chdir(f[1])
		case "pwd": // getcwd(2); f[1] is ignored
			res, err = unix.Getwd()
		case "pwdloop": // getcwd(2) again and again for f[1] ms: "calls failures first-error"
			res = pwdLoop(f[1])
		case "statloop": // lstat f[1] again and again for f[2] ms: the number of calls
			res = statLoop(f[1], f[2])
		case "mkcd": // mkdir, chdir at once, getcwd(2) at once and again after f[2] ms
			res, err = mkcd(f[1], f[2])
		case "modify": // modify PATH HOW: change a file's content one way (modify)
			err = modify(f[1], f[2])
		case "rename":
			err = unix.Rename(f[1], f[2])
		case "exchange":
			err = unix.Renameat2(unix.AT_FDCWD, f[1], unix.AT_FDCWD, f[2], unix.RENAME_EXCHANGE)
		case "link":
			err = unix.Link(f[1], f[2])
		case "unlink":
			err = unix.Unlink(f[1])
		case "rmdir":
			err = unix.Rmdir(f[1])
		case "chmod":
			m, _ := strconv.ParseUint(f[2], 8, 32)
			err = unix.Chmod(f[1], uint32(m))
		case "open":
			var fd int
			fd, err = unix.Open(f[1], unix.O_RDWR, 0)
			if err == nil {
				next++
				res = strconv.Itoa(next)
				handles[res] = fd
			}
		case "read", "write", "close":
			fd, ok := handles[f[1]]
			if !ok {
				err = unix.EBADF
				break
			}
			switch f[0] {
			case "read":
				buf := make([]byte, 4096)
				var n int
				n, err = unix.Pread(fd, buf, 0)
				res = string(buf[:max(n, 0)])
			case "write":
				_, err = unix.Pwrite(fd, []byte(f[2]), 0)
			case "close":
				err = unix.Close(fd)
				delete(handles, f[1])
			}
		default:
			fmt.Fprintln(w, "error unknown command")
			w.Flush()
			continue
		}
		if err != nil {
			var e syscall.Errno
			if errors.As(err, &e) {
				fmt.Fprintf(w, "errno %s\n", unix.ErrnoName(e))
			} else {
				fmt.Fprintf(w, "error %q\n", err.Error())
			}
		} else {
			fmt.Fprintf(w, "ok %q\n", res)
		}
		w.Flush()
	}
}

// mapped maps the file at p shared and read-only, closes its descriptor
// (the mapping keeps the file open), prints "mapped", and answers each line
// of stdin with the mapping's bytes or "SIGBUS".
func mapped(p string) {
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if report(err) {
		return
	}
	var st unix.Stat_t
	if report(unix.Fstat(fd, &st)) {
		return
	}
	m, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if report(err) {
		return
	}
	unix.Close(fd)
	fmt.Println("mapped")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if b, ok := touch(m); ok {
			fmt.Printf("read %q\n", b)
		} else {
			fmt.Println("SIGBUS")
		}
	}
}

// touch copies a mapping; a fault (the daemon refused the page) is
// recovered and reported as !ok.
func touch(m []byte) (b []byte, ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			b, ok = nil, false
		}
	}()
	return append([]byte(nil), m...), true
}

func readAll(fd int) {
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if !report(err) {
		fmt.Printf("read %q\n", buf[:n])
	}
}

func report(err error) bool {
	if err == nil {
		return false
	}
	if e, ok := err.(syscall.Errno); ok {
		fmt.Printf("errno %s\n", unix.ErrnoName(e))
	} else {
		fmt.Printf("error %v\n", err)
	}
	return true
}

// pwdLoop asks getcwd(2) for the working directory's name for ms
// milliseconds and reports how often, how often it failed or answered
// another name, and the first such answer.
func pwdLoop(ms string) string {
	n, _ := strconv.Atoi(ms)
	want, err := unix.Getwd()
	if err != nil {
		return "0 1 " + strconv.Quote(err.Error())
	}
	calls, failures, first := 0, 0, ""
	for end := time.Now().Add(time.Duration(n) * time.Millisecond); time.Now().Before(end); {
		for i := 0; i < 100; i++ {
			calls++
			if got, err := unix.Getwd(); err != nil || got != want {
				failures++
				if first == "" {
					first = fmt.Sprintf("%q %v", got, err)
				}
			}
		}
	}
	return fmt.Sprintf("%d %d %s", calls, failures, strconv.Quote(first))
}

// statLoop lstats path for ms milliseconds: another process walking the
// path, as agents' tools do.
func statLoop(path, ms string) string {
	n, _ := strconv.Atoi(ms)
	calls := 0
	var st unix.Stat_t
	for end := time.Now().Add(time.Duration(n) * time.Millisecond); time.Now().Before(end); calls++ {
		unix.Lstat(path, &st)
	}
	return strconv.Itoa(calls)
}

// mkcd makes dir, enters it at once and asks getcwd(2) for its name at once
// and again after wait milliseconds, as `mkdir d && cd d && node` does: the
// name must stay the directory's for a process inside it.
func mkcd(dir, wait string) (string, error) {
	ms, _ := strconv.Atoi(wait)
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	if err := unix.Chdir(dir); err != nil {
		return "", err
	}
	first, err := unix.Getwd()
	if err != nil {
		return "", fmt.Errorf("getcwd at once: %w", err)
	}
	time.Sleep(time.Duration(ms) * time.Millisecond)
	later, err := unix.Getwd()
	if err != nil {
		return "", fmt.Errorf("getcwd after %d ms: %w", ms, err)
	}
	if first != later {
		return "", fmt.Errorf("getcwd said %s, then %s", first, later)
	}
	return later, nil
}

// modify changes the file at p's content as how says, each the way a
// program would: write(2), pwrite(2), ftruncate(2), truncate(2), an open
// with O_TRUNC (with and without O_CREAT), fallocate(2), copy_file_range(2) from a file beside it,
// splice(2) from a pipe; or its mode, setuid and setgid on (chmod).
func modify(p, how string) error {
	switch how {
	case "truncate":
		return unix.Truncate(p, 1)
	case "chmod": // setuid and setgid on: only the owner may
		return unix.Chmod(p, 0o6777)
	}
	flags := unix.O_WRONLY
	switch how {
	case "otrunc":
		flags |= unix.O_TRUNC
	case "creat": // an existing file, opened by open(2) with O_CREAT|O_TRUNC
		flags |= unix.O_CREAT | unix.O_TRUNC
	}
	fd, err := unix.Open(p, flags, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	switch how {
	case "write":
		_, err = unix.Write(fd, []byte("x"))
	case "pwrite":
		_, err = unix.Pwrite(fd, []byte("x"), 3)
	case "ftruncate":
		err = unix.Ftruncate(fd, 1)
	case "fallocate":
		err = unix.Fallocate(fd, 0, 0, 4096)
	case "copyrange":
		err = copyRange(p, fd)
	case "splice":
		err = spliceIn(fd)
	case "otrunc", "creat":
	default:
		err = fmt.Errorf("unknown way %q", how)
	}
	return err
}

// copyRange copies one byte into fd at offset 2 with copy_file_range(2),
// from a file it makes beside p (the same filesystem) and removes.
func copyRange(p string, fd int) error {
	src := fmt.Sprintf("%s.src%d", p, os.Getpid())
	if err := os.WriteFile(src, []byte("y"), 0o600); err != nil {
		return err
	}
	defer os.Remove(src)
	in, err := unix.Open(src, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	off := int64(2)
	_, err = unix.CopyFileRange(in, nil, fd, &off, 1, 0)
	return err
}

// spliceIn moves one byte from a pipe into fd at offset 5 with splice(2).
func spliceIn(fd int) error {
	var pp [2]int
	if err := unix.Pipe(pp[:]); err != nil {
		return err
	}
	defer unix.Close(pp[0])
	defer unix.Close(pp[1])
	if _, err := unix.Write(pp[1], []byte("z")); err != nil {
		return err
	}
	off := int64(5)
	_, err := unix.Splice(pp[0], nil, fd, &off, 1, 0)
	return err
}
