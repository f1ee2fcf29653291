package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"

	"github.com/condfs/condfs/control"
)

// The FUSE benchmarks run the same operations over the same tree three
// ways in one run: the native filesystem, go-fuse's plain loopback, and a
// condfs view with 1,000 rules (the files touched are under no rule; reads
// come from the FUSE page cache, since a passthrough handle could not be
// revoked). They need root (docs/performance.md, "FUSE views").
//
//	cd bench && CONDFS_BENCH_BIG=256 go test -run '^$' -bench 'FS|ContextSet' -benchtime 1s -count 3
//
// CONDFS_BENCH_BIG sets the sequential-read file size in MiB (default 1024).
// CONDFS_BENCH_METRICS=1 serves the daemon's metrics (FUSE requests timed).
// CONDFS_BENCH_UID runs every operation as that uid (on a thread whose uids
// and gids are all that uid; FUSE requests carry them), so that condfs acts
// as a non-root caller; the session is opened for that uid, and the loopback
// is that uid's own mount.

type fixture struct {
	backing string            // the tree (workspace of the agent home)
	mounts  map[string]string // name -> directory showing the tree
	stop    []func()
	ctl     *control.Client
}

var fx *fixture

// buildCondfs builds the client and the daemon binary into dir as make
// build does (the client without cgo).
func buildCondfs(dir string) error {
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/condfs")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build condfs: %v\n%s", err, b)
	}
	return build("..", dir+"/", "./cmd/condfsd")
}

// build builds the packages pkgs of the module in dir: into out, or into
// the directory out names when it ends in a slash.
func build(dir, out string, pkgs ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkgs, err, b)
	}
	return nil
}

func rules1000() string {
	var b strings.Builder
	for i := 0; i < 1000; i++ {
		space := []string{"memories", "workspace"}[i%2]
		fmt.Fprintf(&b, "[%s.\"/team%d/project%d/\"]\nwhen = \"discord:guild:%d\"\naction = \"allow\"\n\n", space, i%50, i, i)
	}
	return b.String()
}

func setup() (*fixture, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the FUSE benchmarks need root")
	}
	tmp, err := os.MkdirTemp("", "condfs-bench")
	if err != nil {
		return nil, err
	}
	f := &fixture{mounts: map[string]string{}}
	f.stop = append(f.stop, func() { os.RemoveAll(tmp) })
	home := filepath.Join(tmp, "home")
	for _, d := range []string{"config", "blocks/conditional", "memories", "workspace"} {
		os.MkdirAll(filepath.Join(home, d), 0o755)
	}
	// All three variants reach the tree at the same depth: home/workspace,
	// loop/workspace (loopback of home) and mnt/workspace (the view).
	loopDir, mnt := filepath.Join(tmp, "loop"), filepath.Join(tmp, "mnt")
	os.MkdirAll(loopDir, 0o755)
	os.WriteFile(filepath.Join(home, "config/conditions.toml"), []byte(rules1000()+macroRules), 0o644)
	f.backing = filepath.Join(home, "workspace")
	if err := populate(f.backing); err != nil {
		return f, err
	}
	bin := filepath.Join(tmp, "bin")
	if err := buildCondfs(bin); err != nil {
		return f, err
	}
	if err := build(".", filepath.Join(bin, "loopback"), "./loopback"); err != nil {
		return f, err
	}
	if benchUID > 0 {
		// The caller must be able to reach and change the tree natively,
		// and mount its own loopback of it (/dev/fuse 0666, as most
		// distributions ship it).
		if st, err := os.Stat("/dev/fuse"); err == nil && st.Mode().Perm() != 0o666 {
			os.Chmod("/dev/fuse", 0o666)
			f.stop = append(f.stop, func() { os.Chmod("/dev/fuse", st.Mode().Perm()) })
		}
		os.Chmod(tmp, 0o755)
		for _, p := range []string{f.backing, loopDir} {
			filepath.Walk(p, func(p string, _ os.FileInfo, err error) error {
				if err == nil {
					os.Lchown(p, benchUID, benchUID)
				}
				return nil
			})
		}
	}
	// go-fuse loopback over the same tree; with CONDFS_BENCH_UID, the
	// caller's own (run as that uid, mounted through fusermount3), as a
	// user who compares condfs with what they could mount themselves.
	loop := exec.Command(filepath.Join(bin, "loopback"), home, loopDir)
	if benchUID > 0 {
		loop = testenv.CommandAs(benchUID, filepath.Join(bin, "loopback"), home, loopDir)
	}
	out, _ := loop.StdoutPipe()
	loop.Stderr = os.Stderr
	if err := loop.Start(); err != nil {
		return f, err
	}
	f.stop = append(f.stop, func() { loop.Process.Signal(syscall.SIGTERM); loop.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		return f, fmt.Errorf("loopback did not start: %q %v", line, err)
	}
	// condfs with 1,000 rules.
	sock := filepath.Join(tmp, "run/condfs.sock")
	args := []string{"serve", "--root", home, "--socket", sock, "--log-level", "error", "--state-dir", os.Getenv("CONDFS_BENCH_STATE")}
	if os.Getenv("CONDFS_BENCH_METRICS") != "" {
		// Every FUSE request timed into a histogram: its cost shows
		// against a run without.
		args = append(args, "--metrics", filepath.Join(tmp, "metrics.sock"))
	}
	d := exec.Command(filepath.Join(bin, "condfs"), args...)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		return f, err
	}
	f.stop = append(f.stop, func() { d.Process.Signal(syscall.SIGTERM); d.Wait() })
	for i := 0; ; i++ {
		if f.ctl, err = control.Dial(sock); err == nil {
			break
		}
		if i > 200 {
			return f, fmt.Errorf("condfs did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	open := map[string]any{"id": "b", "mount": mnt, "context": []string{"discord:guild:7"}}
	if benchUID > 0 {
		open["owner"] = benchUID
	}
	if err := f.ctl.Call("session.open", open, nil); err != nil {
		return f, err
	}
	f.mounts["native"] = f.backing
	f.mounts["loopback"] = filepath.Join(loopDir, "workspace")
	f.mounts["condfs"] = filepath.Join(mnt, "workspace")
	return f, nil
}

const dirFiles = 100

func populate(dir string) error {
	os.MkdirAll(filepath.Join(dir, "data/dir"), 0o755)
	os.WriteFile(filepath.Join(dir, "data/file"), []byte("hello"), 0o644)
	for i := 0; i < dirFiles; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("data/dir/f%03d", i)), []byte("x"), 0o644)
	}
	os.MkdirAll(filepath.Join(dir, "data/create"), 0o755)
	os.MkdirAll(filepath.Join(dir, "many"), 0o755)
	for i := 0; i < 10000; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("many/f%05d", i)), nil, 0o644)
	}
	size := int64(1024)
	if s := os.Getenv("CONDFS_BENCH_BIG"); s != "" {
		fmt.Sscan(s, &size)
	}
	return writeWarm(filepath.Join(dir, "data/big"), int(size))
}

func TestMain(m *testing.M) {
	var err error
	if wantsFUSE() {
		fx, err = setup()
		if err != nil {
			fmt.Fprintln(os.Stderr, "FUSE benchmark setup:", err)
		}
	}
	code := m.Run()
	if plainDir != "" {
		os.RemoveAll(plainDir)
	}
	if fx != nil {
		for i := len(fx.stop) - 1; i >= 0; i-- {
			fx.stop[i]()
		}
	}
	if err != nil {
		code = 1
	}
	os.Exit(code)
}

// wantsFUSE reports whether the run selects FUSE benchmarks.
func wantsFUSE() bool {
	for _, a := range os.Args {
		if strings.HasPrefix(a, "-test.bench=") && a != "-test.bench=" {
			pat := strings.TrimPrefix(a, "-test.bench=")
			return pat == "." || strings.Contains(pat, "FS") || strings.Contains(pat, "ContextSet") || strings.Contains(pat, "Macro") || strings.Contains(pat, "Goals") || strings.Contains(pat, "Staged")
		}
	}
	return false
}

var benchUID = func() int {
	var uid int
	fmt.Sscan(os.Getenv("CONDFS_BENCH_UID"), &uid)
	return uid
}()

func each(b *testing.B, fn func(b *testing.B, dir string)) {
	if fx == nil {
		b.Fatal("no FUSE fixture (run as root with -bench selecting FS)")
	}
	for _, name := range []string{"native", "loopback", "condfs"} {
		b.Run(name, func(b *testing.B) {
			// With CONDFS_BENCH_UID, every variant runs as a process of
			// that uid would (the loopback is that uid's own mount).
			if err := asBenchUID(func() error { fn(b, fx.mounts[name]); return nil }); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func BenchmarkFSStat(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		p := filepath.Join(dir, "data/file")
		var st syscall.Stat_t
		for b.Loop() {
			if err := syscall.Lstat(p, &st); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkFSOpenClose(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		p := filepath.Join(dir, "data/file")
		for b.Loop() {
			fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
			if err != nil {
				b.Fatal(err)
			}
			syscall.Close(fd)
		}
	})
}

func BenchmarkFSReaddirLstat(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		d := filepath.Join(dir, "data/dir")
		var st syscall.Stat_t
		for b.Loop() {
			ents, err := os.ReadDir(d)
			if err != nil || len(ents) != dirFiles {
				b.Fatal(len(ents), err)
			}
			for _, e := range ents {
				syscall.Lstat(filepath.Join(d, e.Name()), &st)
			}
		}
	})
}

func BenchmarkFSCreateWrite(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		d := filepath.Join(dir, "data/create")
		buf := make([]byte, 4096)
		i := 0
		for b.Loop() {
			p := filepath.Join(d, fmt.Sprintf("n%d", i))
			i++
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			f.Write(buf)
			f.Close()
			b.StopTimer()
			os.Remove(p)
			b.StartTimer()
		}
	})
}

func BenchmarkFSSeqRead(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		p := filepath.Join(dir, "data/big")
		buf := make([]byte, 1<<20)
		st, _ := os.Stat(p)
		b.SetBytes(st.Size())
		for b.Loop() {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			for {
				_, err := f.Read(buf)
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			f.Close()
		}
	})
}

// BenchmarkContextSet: context.set over the socket with 10,000 entries in
// the kernel's cache; the baseline is a status call on the same connection.
func BenchmarkContextSet(b *testing.B) {
	if fx == nil {
		b.Fatal("no FUSE fixture")
	}
	many := filepath.Join(fx.mounts["condfs"], "many")
	warm := func() {
		ents, _ := os.ReadDir(many)
		var st syscall.Stat_t
		for _, e := range ents {
			syscall.Lstat(filepath.Join(many, e.Name()), &st)
		}
	}
	b.Run("status-baseline", func(b *testing.B) {
		for b.Loop() {
			fx.ctl.Call("status", map[string]any{}, nil)
		}
	})
	// Each switch is timed after the cache was warmed with 10,000 entries;
	// warming is not timed, so the loop runs a fixed number of switches.
	b.Run("context.set-10k-cached", func(b *testing.B) {
		ctxs := [][]string{{"discord:guild:7"}, {"discord:guild:8"}}
		const switches = 40
		var total time.Duration
		for i := 0; i < switches; i++ {
			warm()
			t0 := time.Now()
			if err := fx.ctl.Call("context.set", map[string]any{"session": "b", "context": ctxs[i%2]}, nil); err != nil {
				b.Fatal(err)
			}
			total += time.Since(t0)
		}
		b.ReportMetric(float64(total.Nanoseconds())/switches, "ns/switch")
	})
	// A reload with the same cache: every cached entry is looked at (its
	// decision may change under the new rules) and, where the kernel can,
	// expired rather than the whole connection's marked stale.
	b.Run("config.reload-10k-cached", func(b *testing.B) {
		const reloads = 5
		var total time.Duration
		for i := 0; i < reloads; i++ {
			warm()
			t0 := time.Now()
			if err := fx.ctl.Call("config.reload", map[string]any{}, nil); err != nil {
				b.Fatal(err)
			}
			total += time.Since(t0)
		}
		b.ReportMetric(float64(total.Nanoseconds())/reloads, "ns/reload")
	})
}
