package runs

// The names of a host program, as a run lays them out. The sandbox shows
// /usr whole and recreates the host's top-level directory links (/bin ->
// usr/bin where /usr is merged), and binds each listed binary at its
// place: its parent directory resolved, its own name kept (sandbox.Spec).
// So /bin/true and /usr/bin/true are one program in a run, and the
// daemon's checks before a run answer for both names alike: a command
// named either way is the program listed either way, and the exec rules
// of every spelling decide it.

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// mergedDirs are the host directories that may be links into /usr
// (usr-merge): the run shows each as the host does.
var mergedDirs = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/sbin"}

// hostPlace is where the run shows the file p (absolute, clean): its
// parent resolved through the host's links, its own name kept, as the
// sandbox places a listed binary. A path of the view, or one whose parent
// does not resolve, is itself.
func hostPlace(p string) string {
	if inView(p) || p == "/" {
		return p
	}
	dir, err := filepath.EvalSymlinks(path.Dir(p))
	if err != nil {
		return p
	}
	return path.Join(dir, path.Base(p))
}

// mergeLinks are the host's merged directories that are links, each with
// what it resolves to (/bin and /usr/bin).
func mergeLinks() [][2]string {
	var out [][2]string
	for _, d := range mergedDirs {
		if t, err := filepath.EvalSymlinks(d); err == nil && t != d {
			out = append(out, [2]string{d, t})
		}
	}
	return out
}

// spellings are the names that reach the same place as p through the
// host's directory links (mergeLinks; p first): /bin/true and
// /usr/bin/true.
func spellings(p string, links [][2]string) []string {
	out := []string{p}
	add := func(s string) {
		for _, o := range out {
			if o == s {
				return
			}
		}
		out = append(out, s)
	}
	place := hostPlace(p)
	add(place)
	for _, l := range links {
		if rest, ok := strings.CutPrefix(place, l[1]+"/"); ok {
			add(l[0] + "/" + rest)
		}
	}
	return out
}

func inView(p string) bool {
	return p == "/workspace" || p == "/memories" || strings.HasPrefix(p, "/workspace/") || strings.HasPrefix(p, "/memories/")
}

// allowedBinaries is what of binaries the context allows (none without a
// [sandbox] table): each listed name the exec rules allow, under every
// spelling a listed file has (an [exec."/bin/true"] rule decides
// /usr/bin/true too; where the spellings' rules disagree, it is refused).
func allowedBinaries(cfg *acl.Config, set cctx.Set, binaries []string) []string {
	if cfg.Sandbox() == nil {
		return nil
	}
	out := cfg.AllowedBinaries(set, binaries)
	links := mergeLinks()
	kept := out[:0]
	for _, n := range out {
		ok := true
		if !strings.HasSuffix(n, "/") {
			for _, s := range spellings(n, links)[1:] {
				if allow, _ := cfg.Decide(acl.Exec, s, set); !allow {
					ok = false
					break
				}
			}
		}
		if ok {
			kept = append(kept, n)
		}
	}
	return kept
}

// reaches reports whether the command c (absolute, clean, outside the
// view) is the listed binaries entry a where a run shows them: the same
// place, or beneath a listed directory's.
func reaches(c, a string) bool {
	if d, ok := strings.CutSuffix(a, "/"); ok {
		return strings.HasPrefix(hostPlace(c), hostPlace(d)+"/")
	}
	return hostPlace(c) == hostPlace(a)
}

// ExplainExec answers acl's ExplainExec for the program a run reaches by
// the name raw, as a run decides it (allowedBinaries, commandAllowed):
// /bin/true is the program listed as /usr/bin/true, and the exec rules of
// every spelling of a listed name decide it. acl check and path.check
// answer with it, so they never disagree with a run.
func ExplainExec(cfg *acl.Config, raw string, set cctx.Set) (acl.Explanation, error) {
	ex, err := cfg.ExplainExec(raw, set)
	if err != nil || cfg.Sandbox() == nil || inView(ex.Path) {
		return ex, err
	}
	canon := ex.Path
	var listed []string
	for _, a := range cfg.Sandbox().Binaries() {
		if !inView(a) && reaches(canon, a) {
			listed = append(listed, a)
		}
	}
	if len(listed) == 0 {
		return ex, nil // not listed by any name: acl's denial
	}
	if allowed := allowedBinaries(cfg, set, listed); len(allowed) > 0 {
		a, err := cfg.ExplainExec(strings.TrimSuffix(allowed[0], "/"), set)
		if a.Decision != "allow" || err != nil {
			// A listed directory: the name beneath it is decided.
			a = cfg.Explain(acl.Exec, canon, set)
		}
		if a.Decision != "allow" {
			return deniedAs(a, canon), nil
		}
		if a.Path != canon {
			a.Why = fmt.Sprintf("a run shows %s as %s, which [sandbox] binaries lists", canon, allowed[0])
		}
		a.Path = canon
		return a, nil
	}
	// Refused: the rule of the first name or spelling that denies.
	links := mergeLinks()
	for _, a := range listed {
		for _, s := range spellings(strings.TrimSuffix(a, "/"), links) {
			if e := cfg.Explain(acl.Exec, s, set); e.Decision == "deny" {
				return deniedAs(e, canon), nil
			}
		}
		if e := cfg.Explain(acl.Exec, canon, set); e.Decision == "deny" {
			return deniedAs(e, canon), nil
		}
	}
	// A listed directory that a rule beneath it keeps from running here.
	ex.Decision, ex.Why = "deny", "the exec rules keep every listed entry that holds it from running in this context"
	return ex, nil
}

// deniedAs is the denial e, made for another spelling of canon, told as
// canon's.
func deniedAs(e acl.Explanation, canon string) acl.Explanation {
	e.Decision = "deny"
	if e.Path != canon {
		why := e.Why
		if why == "" {
			why = "the exec rules deny it"
		}
		e.Why = fmt.Sprintf("a run shows %s as %s: %s", canon, e.Path, why)
		e.Path = canon
	}
	return e
}
