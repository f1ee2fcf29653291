package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/internal/lazyregexp"
)

// compNode is a command or subcommand, with the flags and subcommands its
// --help shows.
type compNode struct {
	name  string
	flags []string
	subs  []compNode
}

var (
	flagLine = lazyregexp.New(`(?m)^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)`)
	// "condfs policy lint FILE", "condfs hook claude-code ...": a
	// subcommand named in a usage line.
	usageSub = lazyregexp.New(`condfs ([a-z]+) ([a-z][a-z-]+)\b`)
	// ctl lists its subcommands under "Commands": "  open ID MOUNT ...".
	listedSub = lazyregexp.New(`(?m)^  ([a-z][a-z-]+)(?: |$)`)
)

// completionTree is read from the commands' own --help, so completion
// offers exactly what --help documents.
func completionTree() []compNode {
	help := func(args ...string) string {
		var b bytes.Buffer
		run(append(args, "--help"), &b, &b)
		return b.String()
	}
	flagsOf := func(text string) []string {
		var out []string
		for _, m := range flagLine().FindAllStringSubmatch(text, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
		return append(out, "--help")
	}
	var tree []compNode
	for _, c := range commands() {
		if c.Run == nil || c.Name == "completion" {
			continue
		}
		text := help(c.Name)
		n := compNode{name: c.Name, flags: flagsOf(text)}
		var subs []string
		for _, m := range usageSub().FindAllStringSubmatch(text, -1) {
			if m[1] == c.Name && !slices.Contains(subs, m[2]) {
				subs = append(subs, m[2])
			}
		}
		if _, after, ok := strings.Cut(text, "\nCommands"); ok {
			block, _, _ := strings.Cut(after, "\n\n")
			for _, m := range listedSub().FindAllStringSubmatch(block, -1) {
				if !slices.Contains(subs, m[1]) {
					subs = append(subs, m[1])
				}
			}
		}
		for _, s := range subs {
			n.subs = append(n.subs, compNode{name: s, flags: flagsOf(help(c.Name, s))})
		}
		tree = append(tree, n)
	}
	return tree
}

func names(ns []compNode) string {
	var out []string
	for _, n := range ns {
		out = append(out, n.name)
	}
	return strings.Join(out, " ")
}

func runCompletion(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("completion", "condfs completion bash|zsh|fish",
		`Print a completion script for the shell, made from the commands' own --help.
  bash: source <(condfs completion bash)   (or save it in /etc/bash_completion.d/condfs)
  zsh:  condfs completion zsh > "${fpath[1]}/_condfs"
  fish: condfs completion fish > ~/.config/fish/completions/condfs.fish`, stderr)
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cli.UsageErr(stderr, fs, "want one shell: bash, zsh or fish")
	}
	tree := completionTree()
	switch fs.Arg(0) {
	case "bash":
		writeBash(stdout, tree)
	case "zsh":
		writeZsh(stdout, tree)
	case "fish":
		writeFish(stdout, tree)
	default:
		return cli.UsageErr(stderr, fs, "unknown shell %q: want bash, zsh or fish", fs.Arg(0))
	}
	return nil
}

func writeBash(w io.Writer, tree []compNode) {
	fmt.Fprintf(w, `# condfs completion for bash (condfs completion bash)
_condfs() {
  local cur=${COMP_WORDS[COMP_CWORD]} words=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    words=%q
  else
    case "${COMP_WORDS[1]}" in
`, names(tree)+" help completion")
	for _, n := range tree {
		fmt.Fprintf(w, "    %s)\n", n.name)
		if len(n.subs) == 0 {
			fmt.Fprintf(w, "      words=%q ;;\n", strings.Join(n.flags, " "))
			continue
		}
		fmt.Fprintf(w, "      if [ \"$COMP_CWORD\" -eq 2 ]; then words=%q; else\n        case \"${COMP_WORDS[2]}\" in\n", names(n.subs)+" "+strings.Join(n.flags, " "))
		for _, s := range n.subs {
			fmt.Fprintf(w, "          %s) words=%q ;;\n", s.name, strings.Join(s.flags, " "))
		}
		fmt.Fprintf(w, "          *) words=%q ;;\n        esac\n      fi ;;\n", strings.Join(n.flags, " "))
	}
	fmt.Fprintf(w, `    completion) words="bash zsh fish" ;;
    help) words=%q ;;
    esac
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _condfs condfs
`, names(tree))
}

func writeZsh(w io.Writer, tree []compNode) {
	fmt.Fprintf(w, `#compdef condfs
# condfs completion for zsh (condfs completion zsh)
_condfs() {
  local -a w
  if (( CURRENT == 2 )); then
    w=(%s help completion)
  else
    case $words[2] in
`, names(tree))
	for _, n := range tree {
		fmt.Fprintf(w, "      %s)\n", n.name)
		if len(n.subs) == 0 {
			fmt.Fprintf(w, "        w=(%s) ;;\n", strings.Join(n.flags, " "))
			continue
		}
		fmt.Fprintf(w, "        if (( CURRENT == 3 )); then w=(%s %s); else\n          case $words[3] in\n", names(n.subs), strings.Join(n.flags, " "))
		for _, s := range n.subs {
			fmt.Fprintf(w, "            %s) w=(%s) ;;\n", s.name, strings.Join(s.flags, " "))
		}
		fmt.Fprintf(w, "            *) w=(%s) ;;\n          esac\n        fi ;;\n", strings.Join(n.flags, " "))
	}
	fmt.Fprintf(w, `      completion) w=(bash zsh fish) ;;
      help) w=(%s) ;;
    esac
  fi
  compadd -a w
  [[ $PREFIX == -* ]] || _files
}
compdef _condfs condfs
`, names(tree))
}

func writeFish(w io.Writer, tree []compNode) {
	top := names(tree) + " help completion"
	fmt.Fprintf(w, "# condfs completion for fish (condfs completion fish)\ncomplete -c condfs -f -n __fish_use_subcommand -a %q\n", top)
	fmt.Fprintf(w, "complete -c condfs -f -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'\n")
	fmt.Fprintf(w, "complete -c condfs -f -n '__fish_seen_subcommand_from help' -a %q\n", names(tree))
	for _, n := range tree {
		if len(n.subs) > 0 {
			fmt.Fprintf(w, "complete -c condfs -f -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %q\n", n.name, names(n.subs), names(n.subs))
		}
		for _, f := range n.flags {
			fmt.Fprintf(w, "complete -c condfs -n '__fish_seen_subcommand_from %s' -l %s\n", n.name, strings.TrimPrefix(f, "--"))
		}
		for _, s := range n.subs {
			for _, f := range s.flags {
				if slices.Contains(n.flags, f) {
					continue
				}
				fmt.Fprintf(w, "complete -c condfs -n '__fish_seen_subcommand_from %s; and __fish_seen_subcommand_from %s' -l %s\n", n.name, s.name, strings.TrimPrefix(f, "--"))
			}
		}
	}
}
