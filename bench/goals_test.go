package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"testing"
	"time"
)

// BenchmarkGoals measures the hot path's three goals (docs/performance.md,
// "Goals") as ratios against their baselines in the same run: each
// iteration is one round that times the baseline and condfs back to back,
// so that the machine's drift reaches both; the metric is the median
// ratio over the rounds. Run it as a non-root caller against that caller's
// own loopback:
//
//	cd bench && CONDFS_BENCH_UID=65534 go test -run '^$' -bench Goals -benchtime 9x
//
// open+close and create+write+close are condfs ÷ loopback (time, lower is
// better, goal ≤ 1.0); the warm 256 MiB read of a file under no rule is
// condfs ÷ native (throughput, higher is better, goal ≥ 0.95).
func BenchmarkGoals(b *testing.B) {
	if fx == nil {
		b.Fatal("no FUSE fixture (run as root with -bench selecting Goals)")
	}
	data := filepath.Join(fx.backing, "data")
	big := filepath.Join(data, "goal256")
	if err := writeWarm(big, 256); err != nil {
		b.Fatal(err)
	}
	if benchUID > 0 {
		os.Lchown(big, benchUID, benchUID)
	}
	for _, g := range []struct {
		name, base string
		op         func(dir string) error
		n          int  // operations per timing
		throughput bool // the ratio is base time ÷ condfs time
	}{
		{"OpenClose", "loopback", openClose, 2000, false},
		{"CreateWriteClose", "loopback", createWriteClose, 500, false},
		{"WarmRead256MiB", "native", readWarm, 1, true},
	} {
		b.Run(g.name, func(b *testing.B) {
			dirs := map[string]string{g.base: fx.mounts[g.base], "condfs": fx.mounts["condfs"]}
			timeOf := func(name string) (time.Duration, error) {
				start := time.Now()
				for i := 0; i < g.n; i++ {
					if err := g.op(filepath.Join(dirs[name], "data")); err != nil {
						return 0, fmt.Errorf("%s: %w", name, err)
					}
				}
				return time.Since(start), nil
			}
			round := func() (base, c time.Duration, err error) {
				err = asBenchUID(func() error {
					if base, err = timeOf(g.base); err != nil {
						return err
					}
					c, err = timeOf("condfs")
					return err
				})
				return base, c, err
			}
			if _, _, err := round(); err != nil { // warm both
				b.Fatal(err)
			}
			var ratios []float64
			for b.Loop() {
				base, c, err := round()
				if err != nil {
					b.Fatal(err)
				}
				r := float64(c) / float64(base)
				if g.throughput {
					r = float64(base) / float64(c)
				}
				ratios = append(ratios, r)
			}
			sort.Float64s(ratios)
			metric := "condfs/" + g.base
			if g.throughput {
				metric += "-throughput"
			}
			b.ReportMetric(ratios[len(ratios)/2], metric)
			b.ReportMetric(ratios[0], "min")
			b.ReportMetric(ratios[len(ratios)-1], "max")
		})
	}
}

// asBenchUID runs f on a thread whose uids and gids are all
// CONDFS_BENCH_UID, as a process of that user: the caller's own loopback
// mount (no allow_other) admits only such a process. The thread is never
// unlocked, so it ends with f's goroutine and its identity serves nothing
// else. A benchmark's FailNow inside f ends only that goroutine, which
// still reports (the benchmark is marked failed).
func asBenchUID(f func() error) error {
	if benchUID == 0 {
		return f()
	}
	err := errors.New("the benchmark stopped")
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		id := uintptr(benchUID)
		for _, c := range [][4]uintptr{{syscall.SYS_SETGROUPS, 0, 0, 0}, {syscall.SYS_SETRESGID, id, id, id}, {syscall.SYS_SETRESUID, id, id, id}} {
			if _, _, e := syscall.RawSyscall(c[0], c[1], c[2], c[3]); e != 0 {
				err = fmt.Errorf("act as uid %d: %w", benchUID, e)
				return
			}
		}
		err = f()
	}()
	<-done
	return err
}

func openClose(dir string) error {
	fd, err := syscall.Open(filepath.Join(dir, "file"), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return syscall.Close(fd)
}

var created int

// createWriteClose makes a new 4 KiB file and removes it (the removal is
// timed too, on both sides).
func createWriteClose(dir string) error {
	created++
	p := filepath.Join(dir, "create", fmt.Sprintf("g%d", created))
	fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	if _, err := syscall.Write(fd, page[:]); err != nil {
		syscall.Close(fd)
		return err
	}
	if err := syscall.Close(fd); err != nil {
		return err
	}
	return syscall.Unlink(p)
}

var page [4096]byte

var readBuf = make([]byte, 1<<20)

func readWarm(dir string) error {
	f, err := os.Open(filepath.Join(dir, "goal256"))
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		if _, err := f.Read(readBuf); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// writeWarm writes a file of mib MiB, synced and read once, so that every
// variant reads the same warm page cache and no writeback runs meanwhile.
func writeWarm(p string, mib int) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for i := 0; i < mib; i++ {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, f)
	return err
}
