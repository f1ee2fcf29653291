package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Program is a program agents run, as a shell script (sh -e) run in a
// directory of its own in a view, which checks its own results.
type Program struct {
	Name  string
	Tools []string // what it runs, each on PATH
	// Root: run as root (the session admits uid 0): go builds with the
	// test process's own build cache, warm for -race (the integration
	// tests are built so), where a cold one costs half a minute.
	Root   bool
	Script string
	// Check checks, in the same directory, what Script left there (in the
	// backing tree after a commit, say).
	Check string
}

// Programs are agents' usual programs: git, npm (an install from a local
// tarball: no registry), go build and go test, a Python venv, sqlite3 in
// WAL mode with a reader beside a writer, make -j2 over cc with a
// dependency graph, and prove.
var Programs = []Program{
	{Name: "git", Tools: []string{"git"}, Script: `
git init -q -b main .
git config user.name agent
git config user.email agent@example.com
printf 'one\n' > a.txt
mkdir -p src/lib
printf 'int x;\n' > src/lib/x.c
git add -A
git commit -q -m one
git checkout -q -b feat
printf 'two\n' >> a.txt
git commit -q -am two
printf 'wip\n' >> a.txt
git stash -q
test "$(cat a.txt)" = "$(printf 'one\ntwo')"
git stash pop -q
grep -q wip a.txt
test "$(git status --porcelain)" = " M a.txt"
git checkout -q -- a.txt
git checkout -q main
git merge -q feat
test "$(git log --format=%s | tr '\n' ' ')" = "two one "
test -z "$(git status --porcelain)"
git fsck --no-progress >/dev/null
`, Check: `
test "$(git log --format=%s | tr '\n' ' ')" = "two one "
test -z "$(git status --porcelain)"
git fsck --no-progress >/dev/null
`},
	{Name: "npm", Tools: []string{"node", "npm"}, Script: `
export npm_config_cache="$PWD/.npm" npm_config_update_notifier=false
mkdir dep app
printf '{"name": "dep", "version": "1.0.0", "main": "index.js"}\n' > dep/package.json
echo 'module.exports = 42;' > dep/index.js
(cd dep && npm pack --silent >/dev/null)
cd app
npm init -y >/dev/null
npm install --offline --no-audit --no-fund ../dep/dep-1.0.0.tgz >/dev/null
test "$(node -e 'console.log(require("dep"))')" = 42
grep -q '"dep"' package.json package-lock.json
`, Check: `
cd app
test "$(node -e 'console.log(require("dep"))')" = 42
`},
	{Name: "go", Tools: []string{"go"}, Root: true, Script: `
export GOTOOLCHAIN=local GOFLAGS= GOPROXY=off GOWORK=off
go mod init example.com/ex >/dev/null 2>&1
printf 'package main\n\nfunc add(a, b int) int { return a + b }\n\nfunc main() { println(add(1, 2)) }\n' > main.go
printf 'package main\n\nimport "testing"\n\nfunc TestAdd(t *testing.T) {\n\tif add(1, 2) != 3 {\n\t\tt.Fatal(add(1, 2))\n\t}\n}\n' > main_test.go
go build -race -o ex .
test "$(./ex 2>&1)" = 3
go test -race -count=1 . >/dev/null
`, Check: `
test "$(./ex 2>&1)" = 3
`},
	{Name: "venv", Tools: []string{"python3"}, Script: `
# The view refuses v/bin/python3's link to /usr/bin/python3 (absolute):
# venv warns and copies it.
python3 -m venv --without-pip v 2>/dev/null
test "$(v/bin/python3 -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True
v/bin/python3 -c 'import json, sqlite3; open("out.json", "w").write(json.dumps([1]))'
test "$(cat out.json)" = "[1]"
`, Check: `
test "$(v/bin/python3 -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True
test "$(cat out.json)" = "[1]"
`},
	{Name: "sqlite3", Tools: []string{"sqlite3", "seq", "sed"}, Script: `
test "$(sqlite3 db 'PRAGMA journal_mode=WAL; CREATE TABLE t(a INTEGER, b TEXT);')" = wal
(
	for i in $(seq 30); do
		n=$(sqlite3 -cmd '.timeout 10000' db 'SELECT count(*) FROM t')
		case $n in 0|10000) ;; *) echo "a reader saw $n rows"; exit 1 ;; esac
	done
) & r=$!
{ echo 'BEGIN;'; seq 10000 | sed 's/.*/INSERT INTO t VALUES(&, "row &");/'; echo 'COMMIT;'; } | sqlite3 -cmd '.timeout 10000' db
wait $r
test "$(sqlite3 db 'SELECT count(*), sum(a) FROM t')" = "10000|50005000"
test "$(sqlite3 db 'PRAGMA integrity_check')" = ok
`, Check: `
test "$(sqlite3 db 'SELECT count(*), sum(a) FROM t')" = "10000|50005000"
test "$(sqlite3 db 'PRAGMA integrity_check')" = ok
`},
	{Name: "make", Tools: []string{"make", "cc"}, Script: `
printf 'int a(void) { return 1; }\n' > a.c
printf 'int b(void) { return 2; }\n' > b.c
printf 'int a(void);\nint b(void);\nint main(void) { return a() + b() == 3 ? 0 : 1; }\n' > main.c
printf 'prog: main.o a.o b.o lib/c.txt\n\tcc -o $@ main.o a.o b.o\n%%.o: %%.c\n\tcc -O2 -c -o $@ $<\nlib/c.txt: a.c b.c\n\tmkdir -p lib && cat a.c b.c > $@\nclean:\n\trm -f prog *.o\n' > Makefile
touch -d '-2 minutes' a.c b.c main.c Makefile
make -s -j2
./prog
make -q prog
touch -d '-1 minute' prog main.o a.o b.o lib/c.txt
touch a.c
test "$(make -n | grep -c '^cc')" = 2
make -s -j2
./prog
make -q prog
make -s clean
test ! -e prog
make -s -j2
./prog
`, Check: `
./prog
make -q prog
`},
	{Name: "prove", Tools: []string{"prove", "perl"}, Script: `
mkdir t
printf 'use Test::More tests => 2;\nok(1, "one");\nis(1 + 1, 2, "two");\n' > t/a.t
printf 'use Test::More tests => 1;\nuse Cwd;\nopen(my $f, ">", "b.out") or die;\nprint $f "b\\n";\nclose $f;\nis(-s "b.out", 2, "written in " . getcwd());\n' > t/b.t
prove -Q t/ >/dev/null
prove -j2 -Q t/ >/dev/null
`, Check: `
prove -Q t/ >/dev/null
`},
}

// ProgramPath is PATH for the programs: go's directory, then the system's
// (not the test process's own PATH, whose directories under /root another
// uid cannot search).
func ProgramPath() string {
	dirs := []string{}
	if p, err := exec.LookPath("go"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	return strings.Join(append(dirs, "/usr/local/bin", "/usr/bin", "/bin"), ":")
}

// Missing is the first of p's tools not on ProgramPath, "" if none.
func (p Program) Missing() string {
	for _, tool := range p.Tools {
		found := false
		for _, dir := range filepath.SplitList(ProgramPath()) {
			if st, err := os.Stat(filepath.Join(dir, tool)); err == nil && st.Mode()&0o111 != 0 {
				found = true
				break
			}
		}
		if !found {
			return tool
		}
	}
	return ""
}

// Command is p's script run in dir as its uid. dir is made first, by uid
// 65534 (the sessions' owner, which a staged session's commit writes as).
func (p Program) Command(dir string) *exec.Cmd {
	if p.Root {
		// An error shows in the script's cd.
		CommandAs(Nobody, "mkdir", "-p", dir).Run()
	}
	// -x: a failure's output ends with the command that failed.
	return p.command(dir, "mkdir -p \"$1\" && cd \"$1\"\nset -ex\n"+p.Script)
}

// CheckCommand is p's check run in dir as its uid.
func (p Program) CheckCommand(dir string) *exec.Cmd {
	return p.command(dir, "cd \"$1\"\nset -ex\n"+p.Check)
}

func (p Program) command(dir, script string) *exec.Cmd {
	uid := Nobody
	if p.Root {
		uid = 0
	}
	cmd := CommandAs(uid, "/bin/sh", "-c", script, "sh", dir)
	if p.Root {
		// root's own environment: its go build cache, warm.
		cmd.Env = append(os.Environ(), "PATH="+ProgramPath())
	} else {
		cmd.Env = []string{"PATH=" + ProgramPath(), "HOME=" + dir, "LANG=C", "TMPDIR=" + os.TempDir()}
	}
	return cmd
}

// RunBinaries are what the programs git, sqlite3 and prove run in condfs
// run (a [sandbox] binaries list).
const RunBinaries = `["/bin/sh", "/usr/bin/git", "/usr/lib/git-core/", "/usr/bin/sqlite3", "/usr/bin/prove", "/usr/bin/perl",
	"/usr/bin/cat", "/usr/bin/tr", "/usr/bin/grep", "/usr/bin/mkdir", "/usr/bin/seq", "/usr/bin/sed"]`

// RunArgs are condfs run's arguments that run p's script in dir, a path
// of the run's view (/workspace/...), made first.
func (p Program) RunArgs(dir string) []string {
	return []string{"--cwd", "/workspace", "--timeout", "300s", "--env", "HOME=" + dir, "--env", "PATH=/usr/bin:/bin", "--",
		"/bin/sh", "-c", "mkdir -p \"$1\" && cd \"$1\"\nset -ex\n" + p.Script, "sh", dir}
}

// RunPrograms runs progs all at once, each by command(p), and calls
// change with 0, 1, 2, ... (every 20 ms) until all are done. A program whose
// tool is missing is not run (an error in CI, where .ci/run installs them
// all). It reports each program that failed and returns those that
// succeeded.
func RunPrograms(t *testing.T, progs []Program, command func(p Program) *exec.Cmd, change func(i int)) []Program {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []Program
	failed := map[string]string{}
	for _, p := range progs {
		if tool := p.Missing(); tool != "" {
			if os.Getenv("CI") != "" {
				t.Errorf("%s: %s is not installed", p.Name, tool)
			} else {
				t.Logf("%s not run: %s is not installed", p.Name, tool)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			out, err := command(p).CombinedOutput()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[p.Name] = fmt.Sprintf("%v in %v:\n%s", err, time.Since(start).Round(time.Millisecond), Tail(string(out), 30))
			} else {
				ok = append(ok, p)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	i := 0
	for running := true; running; i++ {
		select {
		case <-done:
			running = false
		case <-time.After(20 * time.Millisecond):
		}
		if change != nil {
			change(i)
		}
	}
	t.Logf("%d programs ran over %d changes", len(progs), i)
	for name, res := range failed {
		t.Errorf("%s failed: %s", name, res)
	}
	return ok
}

// CheckPrograms runs each program's Check in dir(p).
func CheckPrograms(t *testing.T, progs []Program, dir func(p Program) string) {
	t.Helper()
	for _, p := range progs {
		if out, err := p.CheckCommand(dir(p)).CombinedOutput(); err != nil {
			t.Errorf("%s's check in %s: %v\n%s", p.Name, dir(p), err, Tail(string(out), 30))
		}
	}
}
