package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/condfs/condfs/internal/jsonwire"
)

// The hook runs where the file tool will run: a path in a tool's input is
// resolved there (relative to the payload's cwd, ~ to the home directory,
// every symlink and .. as the kernel follows them) before it is decided,
// and the decision is on the file the tool will open. The input the hook
// decides, with the resolved paths, is the input it gives back to Claude
// Code (updatedInput), so the tool opens what was decided. A path that
// cannot be resolved safely (missing where it must exist, a symlink to
// nothing, a loop, a component that is not a directory, ~user, a file
// with more than one name) is denied.
//
// What the hook cannot close: a path changed between the decision and the
// tool's open (a symlink or a hard link planted in between), and what a
// searched directory holds (Glob and Grep may follow a symlink beneath
// it, or read a hard link). The boundary for files is the session's view
// (condfs serve), and for commands condfs run.

// pathUse says what a tool does with a path.
type pathUse int

const (
	// opened: the path must exist (Read, Edit, a directory searched).
	opened pathUse = iota
	// created: the file is written, created when missing; its directory
	// must exist, and a symlink to nothing is refused (writing it would
	// create its target).
	created
)

type pathField struct {
	key string
	use pathUse
	// cwd: when the field is absent, the tool uses the working directory;
	// the hook names it, so that what is searched is what is decided.
	cwd bool
}

// hookPaths are the path fields of Claude Code's file tools.
var hookPaths = map[string][]pathField{
	"Read":         {{key: "file_path"}},
	"Edit":         {{key: "file_path"}},
	"MultiEdit":    {{key: "file_path"}},
	"Write":        {{key: "file_path", use: created}},
	"NotebookEdit": {{key: "notebook_path"}},
	"NotebookRead": {{key: "notebook_path"}},
	"LS":           {{key: "path"}},
	"Glob":         {{key: "path", cwd: true}},
	"Grep":         {{key: "path", cwd: true}},
}

// resolveHookPaths resolves, in input, the paths tool opens; it returns
// why the call cannot be decided, or "", and whether input holds a path
// resolved (the input to give the tool).
func resolveHookPaths(tool, cwd string, input *jsonwire.Value) (changed bool, why string) {
	fields, ok := hookPaths[tool]
	if !ok {
		return false, ""
	}
	for _, f := range fields {
		v := input.Get(f.key)
		var p string
		switch {
		case v == nil && f.cwd:
			p = "."
		case v == nil:
			continue // the tool refuses a call without it
		default:
			s, ok := v.Text()
			if !ok || s == "" {
				return false, fmt.Sprintf("%s must be a non-empty string", f.key)
			}
			p = s
		}
		resolved, err := resolvePath(cwd, p, f.use)
		if err != nil {
			return false, fmt.Sprintf("%s %q cannot be resolved safely (%v); denied", f.key, p, err)
		}
		if tool == "Glob" {
			if why := globStaysUnder(resolved, input.Get("pattern")); why != "" {
				return false, why
			}
		}
		input.Set(f.key, jsonwire.NewString(resolved))
		changed = true
	}
	return changed, ""
}

// resolvePath resolves p as the tool will open it, from cwd; a file
// with more than one name is refused (oneName).
func resolvePath(cwd, p string, use pathUse) (string, error) {
	r, err := resolveName(cwd, p, use)
	if err != nil {
		return "", err
	}
	return r, oneName(r)
}

// oneName refuses a file (not a directory) with more than one name: a
// hard link names a file that may be outside the workspace too, and what
// the tool reads or writes is that file, whichever name the policy was
// shown. A file that does not exist yet has none.
func oneName(p string) error {
	var st syscall.Stat_t
	switch err := syscall.Stat(p, &st); {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR && st.Nlink > 1:
		return fmt.Errorf("%s is a hard link (the file has %d names, and may be named outside too)", p, st.Nlink)
	}
	return nil
}

// resolveName resolves p as the tool will open it, from cwd.
func resolveName(cwd, p string, use pathUse) (string, error) {
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("~: %w", err)
		}
		p = home + p[1:]
	case strings.HasPrefix(p, "~"):
		return "", errors.New("~user is not resolved")
	}
	if !filepath.IsAbs(p) {
		if !filepath.IsAbs(cwd) {
			return "", errors.New("a relative path, and the payload's cwd is not an absolute path")
		}
		// Not filepath.Join: it would clean link/.. away before the
		// symlink is followed, as the kernel does not.
		p = cwd + "/" + p
	}
	if use == opened {
		return evalExisting(p)
	}
	// created: the directory must exist; the name in it is followed when
	// it is a symlink, and must then lead to a file that exists.
	p = strings.TrimRight(p, "/")
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", fmt.Errorf("%q does not name a file", p)
	}
	dir, base := p[:i], p[i+1:]
	if dir == "" {
		dir = "/"
	}
	if base == "" || base == "." || base == ".." {
		return "", fmt.Errorf("%q does not name a file", p)
	}
	rdir, err := evalExisting(dir)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(rdir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", rdir)
	}
	target := filepath.Join(rdir, base)
	st, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return target, nil
	case err != nil:
		return "", err
	case st.Mode()&fs.ModeSymlink != 0:
		r, err := evalExisting(target)
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s is a symlink to nothing: writing it would create its target", target)
		}
		return r, err
	}
	return target, nil
}

// evalExisting follows every symlink and .. of an existing path (the
// kernel's order: a symlink before the .. after it) and returns it clean.
func evalExisting(p string) (string, error) {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(r) {
		return "", fmt.Errorf("%q resolved to a relative path", p)
	}
	return r, nil
}

// maxGlobAlternatives bounds a Glob pattern's brace expansion.
const maxGlobAlternatives = 1024

// globStaysUnder says why a Glob pattern may match outside base (the
// resolved directory searched), or "". Every alternative of its braces
// must be relative, name no .. (with its escapes removed, nor may the
// whole pattern, which covers brace sequences such as {-..0}), and the
// directories it names literally must resolve beneath base.
func globStaysUnder(base string, pv *jsonwire.Value) string {
	if pv == nil {
		return ""
	}
	pattern, ok := pv.Text()
	if !ok {
		return "pattern must be a string"
	}
	if strings.Contains(strings.ReplaceAll(pattern, `\`, ""), "..") {
		return fmt.Sprintf("the pattern %q names .. (it could match outside %s); denied", pattern, base)
	}
	alts, ok := expandBraces(pattern, maxGlobAlternatives)
	if !ok {
		return fmt.Sprintf("the pattern %q has more than %d alternatives; denied", pattern, maxGlobAlternatives)
	}
	for _, alt := range alts {
		a := strings.ReplaceAll(alt, `\`, "")
		if strings.HasPrefix(a, "/") || strings.HasPrefix(a, "~") {
			return fmt.Sprintf("the pattern %q matches absolute paths (%q); give a path and a relative pattern", pattern, alt)
		}
		var literal []string
		for _, c := range strings.Split(a, "/") {
			if c == ".." {
				return fmt.Sprintf("the pattern %q names .. (%q); denied", pattern, alt)
			}
			if strings.ContainsAny(c, "*?[]{}()!+@") {
				break
			}
			literal = append(literal, c)
		}
		// The deepest directory the pattern names literally that exists
		// must resolve beneath base (a symlink there leads elsewhere).
		for n := len(literal); n >= 0; n-- {
			r, err := filepath.EvalSymlinks(base + "/" + strings.Join(literal[:n], "/"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Sprintf("the pattern %q cannot be resolved safely (%v); denied", pattern, err)
			}
			if r != base && !strings.HasPrefix(r, strings.TrimSuffix(base, "/")+"/") {
				return fmt.Sprintf("the pattern %q leads out of %s (to %s); denied", pattern, base, r)
			}
			break
		}
	}
	return ""
}

// expandBraces expands {a,b} alternatives (nested too), at most max; a
// brace without a comma at its level, or unmatched, is literal.
func expandBraces(s string, max int) ([]string, bool) {
	open, close, depth := -1, -1, 0
	comma := false
	for i := 0; i < len(s) && close < 0; i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				open, comma = i, false
			}
			depth++
		case ',':
			if depth == 1 {
				comma = true
			}
		case '}':
			if depth > 0 {
				depth--
				if depth == 0 && comma {
					close = i
				}
			}
		}
	}
	if close < 0 {
		return []string{s}, true
	}
	var parts []string
	start, depth := open+1, 0
	for i := open + 1; i < close; i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	parts = append(parts, s[start:close])
	var out []string
	for _, part := range parts {
		more, ok := expandBraces(s[:open]+part+s[close+1:], max-len(out))
		if !ok || len(out)+len(more) > max {
			return nil, false
		}
		out = append(out, more...)
	}
	return out, true
}
