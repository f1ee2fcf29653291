// Command attacker makes the system calls the attack suite needs, run by
// the tests as an unprivileged uid (setpriv). Each subcommand prints what
// happened on stdout: the bytes read, or "errno NAME".
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: attacker creat|ioctl|cat|chmod|exchange|hold|mmap PATH [ARG]")
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
	default:
		fmt.Fprintln(os.Stderr, "unknown subcommand")
		os.Exit(2)
	}
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
