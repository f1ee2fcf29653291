package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// lockKinds are the ways to take an exclusive lock: flock(2), a POSIX
// record lock (F_SETLKW) and an open file description lock (F_OFD_SETLKW).
var lockKinds = map[string]bool{"flock": true, "posix": true, "ofd": true}

// lockOp takes (typ F_WRLCK or F_RDLCK) or releases (F_UNLCK) a whole-file
// lock of kind on fd, waiting for it unless nb.
func lockOp(fd int, kind string, typ int16, nb bool) error {
	switch kind {
	case "flock":
		op := unix.LOCK_EX
		switch typ {
		case unix.F_RDLCK:
			op = unix.LOCK_SH
		case unix.F_UNLCK:
			op = unix.LOCK_UN
		}
		if nb {
			op |= unix.LOCK_NB
		}
		return unix.Flock(fd, op)
	case "posix", "ofd":
		cmd := unix.F_SETLKW
		switch {
		case kind == "posix" && nb:
			cmd = unix.F_SETLK
		case kind == "ofd" && nb:
			cmd = unix.F_OFD_SETLK
		case kind == "ofd":
			cmd = unix.F_OFD_SETLKW
		}
		return unix.FcntlFlock(uintptr(fd), cmd, &unix.Flock_t{Type: typ, Whence: 0})
	}
	return unix.EINVAL
}

// waiters opens p n times and waits for an exclusive lock of kind on each
// descriptor, in n threads at once. It prints "started" once every waiter
// has its descriptor, then one line per waiter as its lock call returns
// ("locked" or "errno NAME"); locks taken are held until stdin closes.
func waiters(p, kind string, n int) {
	if !lockKinds[kind] {
		fmt.Println("error unknown lock kind")
		os.Exit(2)
	}
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		if report(err) {
			return
		}
		fds[i] = fd
	}
	var mu sync.Mutex
	fmt.Println("started")
	for _, fd := range fds {
		go func() {
			err := lockOp(fd, kind, unix.F_WRLCK, false)
			mu.Lock()
			defer mu.Unlock()
			if !report(err) {
				fmt.Println("locked")
			}
		}()
	}
	bufio.NewScanner(os.Stdin).Scan() // until stdin closes
}

// locker opens p once, prints "open", and answers each line of stdin,
// "KIND TYPE [nb]" (KIND flock, posix or ofd; TYPE w, r or un) or "getlk",
// with "ok", "errno NAME", or for getlk "unlocked" or "locked".
func locker(p string) {
	fd, err := unix.Open(p, unix.O_RDWR, 0)
	if report(err) {
		return
	}
	fmt.Println("open")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 1 && f[0] == "getlk" {
			lk := unix.Flock_t{Type: unix.F_WRLCK}
			if !report(unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk)) {
				if lk.Type == unix.F_UNLCK {
					fmt.Println("unlocked")
				} else {
					fmt.Println("locked")
				}
			}
			continue
		}
		if len(f) < 2 || !lockKinds[f[0]] {
			fmt.Println("error bad command " + strconv.Quote(sc.Text()))
			continue
		}
		typ := map[string]int16{"w": unix.F_WRLCK, "r": unix.F_RDLCK, "un": unix.F_UNLCK}[f[1]]
		if !report(lockOp(fd, f[0], typ, len(f) > 2 && f[2] == "nb")) {
			fmt.Println("ok")
		}
	}
}
