package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func aligned(n int) []byte {
	b := make([]byte, n+8192)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+n]
}

// hold2 PATH FLAGS: FLAGS is a comma list: rw, direct. Commands on stdin:
// r: pread 4096 @0; w DATA: pwrite @0; fstat; close.
func hold2(p, flags string) {
	fl := unix.O_RDONLY
	for _, f := range strings.Split(flags, ",") {
		switch f {
		case "rw":
			fl = unix.O_RDWR
		case "direct":
			fl |= unix.O_DIRECT
		}
	}
	fd, err := unix.Open(p, fl, 0)
	if report(err) {
		return
	}
	fmt.Println("open")
	sc := bufio.NewScanner(os.Stdin)
	buf := aligned(4096)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "r":
			n, err := unix.Pread(fd, buf, 0)
			if !report(err) {
				fmt.Printf("read %q\n", buf[:n])
			}
		case "w":
			_, err := unix.Pwrite(fd, []byte(f[1]), 0)
			if !report(err) {
				fmt.Println("wrote")
			}
		case "fstat":
			var st unix.Stat_t
			if !report(unix.Fstat(fd, &st)) {
				fmt.Println("size", st.Size)
			}
		}
	}
}

// mmapbig PATH: map whole file shared read-only, keep fd; "t OFF" touches
// the byte at OFF (prints 8 bytes or SIGBUS).
func mmapbig(p string) {
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if report(err) {
		return
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	m, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if report(err) {
		return
	}
	unix.Madvise(m, unix.MADV_RANDOM)
	fmt.Println("mapped")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		off, _ := strconv.Atoi(f[1])
		if b, ok := touchAt(m, off); ok {
			fmt.Printf("read %q\n", b)
		} else {
			fmt.Println("SIGBUS")
		}
	}
}

func touchAt(m []byte, off int) (b []byte, ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			b, ok = nil, false
		}
	}()
	return append([]byte(nil), m[off:off+8]...), true
}

// dirhold PATH: open a directory; "ls" rewinds and lists; "at NAME" opens NAME beneath it and reads.
func dirhold(p string) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if report(err) {
		return
	}
	fmt.Println("open")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch f[0] {
		case "ls":
			unix.Seek(fd, 0, 0)
			var names []string
			buf := make([]byte, 8192)
			for {
				n, err := unix.Getdents(fd, buf)
				if err != nil {
					report(err)
					names = nil
					break
				}
				if n <= 0 {
					break
				}
				_, _, ns := unix.ParseDirent(buf[:n], -1, nil)
				names = append(names, ns...)
			}
			fmt.Printf("names %s\n", strings.Join(names, "/"))
		case "at":
			cfd, err := unix.Openat(fd, f[1], unix.O_RDONLY, 0)
			if report(err) {
				continue
			}
			readAll(cfd)
			unix.Close(cfd)
		}
	}
}

// race PATH THREADS MS FLAGS: THREADS goroutines pread the held fd in a loop for MS
// milliseconds; prints counts of results containing SECRET after the first "go" line,
// then after "stop" prints the tally.
func race(p string, threads, ms int, flags string) {
	fl := unix.O_RDONLY
	if strings.Contains(flags, "direct") {
		fl |= unix.O_DIRECT
	}
	fd, err := unix.Open(p, fl, 0)
	if report(err) {
		return
	}
	fmt.Println("open")
	var secret, ok, eacces, other, maxLat atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	var lastOKStart atomic.Int64
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := aligned(4096)
			for !stop.Load() {
				s0 := mono()
				t0 := time.Now()
				n, err := unix.Pread(fd, buf, 0)
				if l := int64(time.Since(t0)); l > maxLat.Load() {
					maxLat.Store(l)
				}
				switch {
				case err == unix.EACCES:
					eacces.Add(1)
				case err != nil:
					other.Add(1)
				case strings.Contains(string(buf[:n]), "SECRET"):
					secret.Add(1)
				default:
					ok.Add(1)
				}
				if err == nil {
					for {
						o := lastOKStart.Load()
						if s0 <= o || lastOKStart.CompareAndSwap(o, s0) {
							break
						}
					}
				}
			}
		}()
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Scan()
	stop.Store(true)
	wg.Wait()
	var renamed int64
	fmt.Sscan(sc.Text(), &renamed)
	fmt.Printf("lastOKStart-renamed=%v ", time.Duration(lastOKStart.Load()-renamed))
	fmt.Printf("secret=%d ok=%d eacces=%d other=%d maxlat=%v\n", secret.Load(), ok.Load(), eacces.Load(), other.Load(), time.Duration(maxLat.Load()))
	_ = ms
	_ = time.Now
}

// busy PATH THREADS: THREADS goroutines keep the view's places busy (write+fsync on PATH,
// and stats of absent names); runs until stdin closes.
func busy(p string, threads int) {
	fd, err := unix.Open(p, unix.O_RDWR, 0)
	if report(err) {
		return
	}
	fmt.Println("busy")
	var stop atomic.Bool
	for i := 0; i < threads; i++ {
		go func(i int) {
			buf := make([]byte, 8<<20)
			for !stop.Load() {
				unix.Pwrite(fd, buf, int64(i)<<23)
				unix.Fsync(fd)
			}
		}(i)
	}
	bufio.NewReader(os.Stdin).ReadString('\n')
	stop.Store(true)
}

func mono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// flip A B: on "go" rename A<->B in a loop; on "pause" stop and print which of A, B exists.
func flip(a, b string) {
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	var stop atomic.Bool
	var done chan struct{}
	var n atomic.Int64
	for sc.Scan() {
		switch sc.Text() {
		case "go":
			stop.Store(false)
			done = make(chan struct{})
			go func() {
				defer close(done)
				for !stop.Load() {
					if unix.Rename(a, b) == nil {
						n.Add(1)
					}
					if unix.Rename(b, a) == nil {
						n.Add(1)
					}
				}
			}()
			fmt.Println("going")
		case "pause":
			stop.Store(true)
			<-done
			if _, err := os.Stat(a); err == nil {
				fmt.Println("at", a, n.Load())
			} else {
				fmt.Println("at", b, n.Load())
			}
		}
	}
}
