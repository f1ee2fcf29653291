// Command scale opens N sessions on one condfs daemon and prints what they
// cost: session.open and session.close latency (p50/p99 at each tenth of
// the way), the daemon's OS threads and RSS per idle session, context.set
// latency and reload-to-enforcement with all N mounted. It needs root.
//
//	cd bench && go run ./scale -n 10000
//	cd bench && go run ./scale -n 2000 -connections per-session
//	cd bench && go run ./scale -n 10000 -nofile 20000
//
// With -nofile the daemon runs under that hard descriptor limit without
// CAP_SYS_RESOURCE (as in a container that cannot raise it), keeps session
// state and uses its default --max-sessions, which must admit all N.
//
// Every figure comes from this run; nothing is compared with a stored value.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/condfs/condfs/internal/testenv"

	"github.com/condfs/condfs/control"
)

func main() {
	n := flag.Int("n", 1000, "sessions to open")
	conns := flag.String("connections", "shared", "shared or per-session (condfs serve --connections)")
	keep := flag.Bool("keep", false, "keep the temporary directory")
	nofile := flag.Int("nofile", 0, "run the daemon under this hard descriptor limit, with its default --max-sessions and session state")
	flag.Parse()
	if err := run(*n, *conns, *keep, *nofile); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

const rules = `[memories."/private/"]
when = "discord:dm"
action = "allow"

[workspace."/guild/"]
when = "discord:guild:1"
action = "allow"
`

func run(n int, conns string, keep bool, nofile int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (views of thousands of sessions are mounted)")
	}
	tmp, err := os.MkdirTemp("", "condfs-scale")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(tmp)
	}
	home := filepath.Join(tmp, "home")
	for _, d := range []string{"config", "blocks/conditional", "memories/private", "workspace/guild"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			return err
		}
	}
	os.WriteFile(filepath.Join(home, "config/conditions.toml"), []byte(rules), 0o644)
	os.WriteFile(filepath.Join(home, "config/policy.yaml"), []byte("version: 1\n"), 0o644)
	os.WriteFile(filepath.Join(home, "memories/private/a.md"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(home, "workspace/guild/b.md"), []byte("b"), 0o644)
	bin := filepath.Join(tmp, "condfs")
	build := exec.Command("go", "build", "-o", tmp+"/", "./cmd/condfs", "./cmd/condfsd")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v\n%s", err, out)
	}
	sock := filepath.Join(tmp, "run/condfs.sock")
	args := []string{bin, "serve", "--root", home, "--socket", sock, "--log-level", "error", "--connections", conns}
	if nofile > 0 {
		args = append(testenv.NofileLimit(nofile), args...)
	} else {
		args = append(args, "--state-dir", "none", "--max-sessions", strconv.Itoa(n+10))
	}
	d := exec.Command(args[0], args[1:]...)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		return err
	}
	defer func() { d.Process.Signal(syscall.SIGTERM); d.Wait() }()
	var ctl *control.Client
	for i := 0; ; i++ {
		if ctl, err = control.Dial(sock); err == nil {
			break
		}
		if i > 250 {
			return fmt.Errorf("condfs did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer ctl.Close()
	pid := d.Process.Pid
	threads0, rss0 := procStatus(pid)
	fds0 := procFDs(pid)
	fmt.Printf("condfs scale: %d sessions, --connections=%s, GOMAXPROCS of the daemon = its default\n", n, conns)
	if nofile > 0 {
		var st struct {
			Limits struct {
				MaxSessions int `json:"max_sessions"`
			} `json:"limits"`
		}
		if err := ctl.Call("status", map[string]any{}, &st); err != nil {
			return err
		}
		fmt.Printf("hard descriptor limit %d, no CAP_SYS_RESOURCE: default --max-sessions %d\n", nofile, st.Limits.MaxSessions)
	}
	fmt.Printf("idle daemon: %d threads, %d KiB RSS, %d descriptors\n\n", threads0, rss0, fds0)

	// The mountpoints are made first, timed as the native baseline: in
	// one directory of a disk filesystem, mkdir itself slows as the
	// directory grows, and an agent runtime makes them either way.
	mnt := filepath.Join(tmp, "mnt")
	os.MkdirAll(mnt, 0o755)
	mkdirs := make([]time.Duration, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := os.Mkdir(filepath.Join(mnt, strconv.Itoa(i)), 0o755); err != nil {
			return err
		}
		mkdirs[i] = time.Since(t0)
	}
	fmt.Println("baseline: mkdir of the mountpoints, by tenth:")
	printTenths(mkdirs)
	opens := make([]time.Duration, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		err := ctl.Call("session.open", map[string]any{
			"id": fmt.Sprintf("s%d", i), "mount": filepath.Join(mnt, strconv.Itoa(i)), "context": []string{"discord:guild:1"},
		}, nil)
		opens[i] = time.Since(t0)
		if err != nil {
			return fmt.Errorf("session.open #%d: %v", i, err)
		}
		// Touch the view: a lookup and a read through the kernel.
		if _, err := os.ReadFile(filepath.Join(mnt, strconv.Itoa(i), "workspace/guild/b.md")); err != nil {
			return fmt.Errorf("view #%d: %v", i, err)
		}
	}
	fmt.Println("session.open latency, by tenth of the sessions opened:")
	printTenths(opens)
	threads1, rss1 := procStatus(pid)
	fds1 := procFDs(pid)
	fmt.Printf("\nwith %d sessions: %d threads, %d KiB RSS: %.1f KiB per session; %d descriptors: %.2f per session\n",
		n, threads1, rss1, float64(rss1-rss0)/float64(n), fds1, float64(fds1-fds0)/float64(n))

	// context.set on sessions spread over all N, each followed by the
	// check that the view changed.
	var sets []time.Duration
	for k := 0; k < 200; k++ {
		i := (k * 7919) % n
		id, view := fmt.Sprintf("s%d", i), filepath.Join(mnt, strconv.Itoa(i))
		t0 := time.Now()
		if err := ctl.Call("context.set", map[string]any{"session": id, "context": []string{"discord:dm"}}, nil); err != nil {
			return err
		}
		sets = append(sets, time.Since(t0))
		if _, err := os.Stat(filepath.Join(view, "workspace/guild")); err == nil {
			return fmt.Errorf("%s: workspace/guild still visible after context.set", id)
		}
		ctl.Call("context.set", map[string]any{"session": id, "context": []string{"discord:guild:1"}}, nil)
	}
	fmt.Printf("\ncontext.set with %d mounted: p50 %v p99 %v\n", n, pct(sets, 50), pct(sets, 99))

	// Reload: the rule changes so that guild/ is hidden everywhere;
	// config.reload answers once every view enforces it.
	var reloads []time.Duration
	for k := 0; k < 5; k++ {
		next := rules
		if k%2 == 0 {
			next = strings.Replace(rules, "discord:guild:1", "discord:guild:9", 1)
		}
		os.WriteFile(filepath.Join(home, "config/conditions.toml"), []byte(next), 0o644)
		t0 := time.Now()
		if err := ctl.Call("config.reload", map[string]any{}, nil); err != nil {
			return err
		}
		reloads = append(reloads, time.Since(t0))
		_, err := os.Stat(filepath.Join(mnt, strconv.Itoa(n-1), "workspace/guild"))
		if (k%2 == 0) != (err != nil) {
			return fmt.Errorf("reload %d not enforced in the last view (stat: %v)", k, err)
		}
	}
	slices.Sort(reloads)
	fmt.Printf("config.reload to enforcement with %d mounted: median %v, max %v\n", n, reloads[len(reloads)/2], reloads[len(reloads)-1])

	closes := make([]time.Duration, n)
	for i := n - 1; i >= 0; i-- {
		t0 := time.Now()
		if err := ctl.Call("session.close", map[string]any{"id": fmt.Sprintf("s%d", i)}, nil); err != nil {
			return fmt.Errorf("session.close #%d: %v", i, err)
		}
		closes[n-1-i] = time.Since(t0)
	}
	fmt.Println("\nsession.close latency, by tenth of the sessions closed:")
	printTenths(closes)
	threads2, rss2 := procStatus(pid)
	fmt.Printf("\nall closed: %d threads, %d KiB RSS\n", threads2, rss2)
	return nil
}

func printTenths(ds []time.Duration) {
	step := max(1, len(ds)/10)
	fmt.Printf("  %-16s %10s %10s\n", "sessions", "p50", "p99")
	for lo := 0; lo < len(ds); lo += step {
		hi := min(len(ds), lo+step)
		part := ds[lo:hi]
		fmt.Printf("  %-16s %10v %10v\n", fmt.Sprintf("%d-%d", lo+1, hi), pct(part, 50), pct(part, 99))
	}
	fmt.Printf("  %-16s %10v %10v\n", "all", pct(ds, 50), pct(ds, 99))
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(len(s)-1, max(0, i-1))].Round(time.Microsecond)
}

// procFDs counts the descriptors pid holds.
func procFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// procStatus reads the thread count and resident set (KiB) of pid.
func procStatus(pid int) (threads, rssKiB int) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "Threads":
			threads, _ = strconv.Atoi(fields[0])
		case "VmRSS":
			rssKiB, _ = strconv.Atoi(fields[0])
		}
	}
	return threads, rssKiB
}
