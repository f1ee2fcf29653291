package acl

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	cctx "github.com/condfs/condfs/context"
)

// The spec's example (sandbox.md), with a prefix rule and rules on view
// files.
const sandboxDesign = `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/git", "/usr/bin/python3", "/usr/bin/curl",
            "/usr/lib/git-core/", "/workspace/bin/"]
network = "none"
memory = "1GiB"
pids = 256
tmp_size = "256MiB"
connections = 256
reach_private = []

[exec."/usr/bin/curl"]
when = "internal"
action = "allow"

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"

[exec."/usr/lib/git-core/"]
when = "discord:nsfw"
action = "deny"

[exec."/usr/lib/git-core/git-upload-pack"]
when = "tui"
action = "allow"

[exec."/workspace/bin/"]
when = "!discord:nsfw"
action = "allow"

[workspace."/bin/private/"]
when = "tui"
action = "allow"
`

func TestSandboxTable(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	sb := c.Sandbox()
	if sb == nil {
		t.Fatal("no sandbox")
	}
	if sb.Network() != NetworkNone || sb.Memory() != 1<<30 || sb.TmpSize() != 256<<20 || sb.Pids() != 256 || sb.Connections() != 256 || len(sb.ReachPrivate()) != 0 {
		t.Fatalf("%+v", sb)
	}
	if got := sb.Binaries(); len(got) != 8 || got[6] != "/usr/lib/git-core/" {
		t.Fatalf("binaries %q", got)
	}
	sb.Binaries()[0] = "/usr/bin/nc" // a copy: the snapshot stays as loaded
	if sb.Binaries()[0] != "/bin/sh" {
		t.Fatal("Binaries hands out the snapshot's own slice")
	}

	if mustParse(t, "").Sandbox() != nil || mustParse(t, design).Sandbox() != nil {
		t.Fatal("a file without [sandbox] has a sandbox")
	}
	min := mustParse(t, "[sandbox]\nbinaries = []\n").Sandbox()
	if min == nil || min.Network() != NetworkNone || min.Memory() != 0 || min.TmpSize() != 0 || min.Pids() != 0 || min.Connections() != DefaultConnections {
		t.Fatalf("defaults: %+v", min)
	}

	pol := mustParse(t, "[sandbox]\nbinaries = []\nnetwork = \"policy\"\nmemory = 1048576\ntmp_size = \"4096\"\nconnections = 3\nreach_private = [\"10.1.2.3\", \"192.168.0.0/16\", \"fd00::/8\"]\n").Sandbox()
	if pol.Network() != NetworkPolicy || pol.Memory() != 1<<20 || pol.TmpSize() != 4096 || pol.Connections() != 3 || pol.Hosts() != "" {
		t.Fatalf("%+v", pol)
	}
	for addr, want := range map[string]bool{
		"10.1.2.3": true, "10.1.2.4": false, "192.168.7.7": true, "::ffff:192.168.1.1": true,
		"fd12::1": true, "fe80::1%eth0": false, "127.0.0.1": false, "169.254.169.254": false,
	} {
		if got := pol.MayReachPrivate(netip.MustParseAddr(addr)); got != want {
			t.Errorf("MayReachPrivate(%s) = %v", addr, got)
		}
	}
	if h := mustParse(t, "[sandbox]\nbinaries = []\nhosts = \"/etc/condfs/hosts\"\n").Sandbox().Hosts(); h != "/etc/condfs/hosts" {
		t.Fatalf("hosts %q", h)
	}
	if mustParse(t, "[sandbox]\nbinaries = []\nnetwork = \"host\"\n").Sandbox().Network() != NetworkHost {
		t.Fatal("network host")
	}
}

func TestSandboxLoadErrors(t *testing.T) {
	const head = "# a comment\n[sandbox]\n"
	for _, tc := range []struct{ text, want string }{
		{head + "binaries = [\"/bin/sh\"]\nshell = \"/bin/sh\"\n", "c.toml:4:10: [sandbox]: unknown key \"shell\""},
		{head + "binaries = []\nhosts = \"etc/hosts\"\n", "c.toml:4:10: [sandbox]: hosts must be the absolute, clean path of a hosts(5) file"},
		{head + "binaries = []\nhosts = \"/etc/../hosts\"\n", "c.toml:4:10: [sandbox]: hosts must be the absolute, clean path"},
		{head + "binaries = []\nhosts = 3\n", "c.toml:4:9: [sandbox]: hosts must be"},
		{head + "binaries = [\"usr/bin/cat\"]\n", "c.toml:3:13: [sandbox]: binaries: \"usr/bin/cat\": not an absolute path"},
		{head + "binaries = [\"/bin/sh\", \"\"]\n", "c.toml:3:13: [sandbox]: binaries: \"\": not an absolute path"},
		{head + "binaries = [\"/usr/bin/../sbin/x\"]\n", "c.toml:3:13: [sandbox]: binaries: \"/usr/bin/../sbin/x\": a path must not hold a \"..\" segment"},
		{head + "binaries = [\"/usr/bin/./x\"]\n", "c.toml:3:13: [sandbox]: binaries: \"/usr/bin/./x\": a path must not hold a \".\" segment"},
		{head + "binaries = [\"/usr//bin/x\"]\n", "c.toml:3:13: [sandbox]: binaries: \"/usr//bin/x\": a path must not hold \"//\""},
		{head + "binaries = [\"/usr/bin/x\\u0000y\"]\n", "c.toml:3:13: [sandbox]: binaries: \"/usr/bin/x\\x00y\": a path must not hold NUL"},
		{head + "binaries = [\"/workspace\"]\n", "c.toml:3:13: [sandbox]: binaries: \"/workspace\": names the workspace space itself"},
		{head + "binaries = [1]\n", "c.toml:3:13: [sandbox]: binaries: 1 is not a string"},
		{head + "binaries = \"/bin/sh\"\n", "c.toml:3:13: [sandbox]: binaries must be an array"},
		{head + "network = \"none\"\n", "c.toml:2:13: [sandbox]: binaries is required"},
		{head + "binaries = []\nnetwork = \"bridge\"\n", "c.toml:4:12: [sandbox]: network must be \"none\", \"host\" or \"policy\""},
		{head + "binaries = []\nnetwork = true\n", "c.toml:4:11: [sandbox]: network must be"},
		{head + "binaries = []\nmemory = \"1GB\"\n", "c.toml:4:11: [sandbox]: memory: want a positive integer of bytes"},
		{head + "binaries = []\nmemory = \"1.5GiB\"\n", "c.toml:4:11: [sandbox]: memory: want"},
		{head + "binaries = []\nmemory = \"-1\"\n", "c.toml:4:11: [sandbox]: memory: want"},
		{head + "binaries = []\nmemory = 0\n", "c.toml:4:10: [sandbox]: memory: want"},
		{head + "binaries = []\nmemory = -5\n", "c.toml:4:10: [sandbox]: memory: want"},
		{head + "binaries = []\nmemory = 1.5e9\n", "c.toml:4:10: [sandbox]: memory: want"},
		{head + "binaries = []\ntmp_size = \"0MiB\"\n", "c.toml:4:13: [sandbox]: tmp_size: want"},
		{head + "binaries = []\ntmp_size = \" 1MiB\"\n", "c.toml:4:13: [sandbox]: tmp_size: want"},
		{head + "binaries = []\ntmp_size = \"99999999999999999TiB\"\n", "c.toml:4:13: [sandbox]: tmp_size: too large"},
		{head + "binaries = []\npids = 0\n", "c.toml:4:8: [sandbox]: pids must be an integer from 1 to 2147483647"},
		{head + "binaries = []\npids = \"256\"\n", "c.toml:4:9: [sandbox]: pids must be an integer"},
		{head + "binaries = []\npids = 4294967296\n", "c.toml:4:8: [sandbox]: pids must be an integer"},
		{head + "binaries = []\nconnections = -1\n", "c.toml:4:15: [sandbox]: connections must be an integer from 1"},
		{head + "binaries = []\nreach_private = [\"10.0.0.1/8\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"10.0.0.1/8\": host bits are set: write 10.0.0.0/8"},
		{head + "binaries = []\nreach_private = [\"10.0.0.300\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"10.0.0.300\": not an address or a CIDR prefix"},
		{head + "binaries = []\nreach_private = [\"10.0.0.0/33\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"10.0.0.0/33\": not a CIDR prefix"},
		{head + "binaries = []\nreach_private = [\"localhost\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"localhost\": not an address"},
		{head + "binaries = []\nreach_private = [\"fe80::1%eth0\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"fe80::1%eth0\": an address with a zone"},
		{head + "binaries = []\nreach_private = [\"::ffff:10.0.0.1\"]\n", "c.toml:4:18: [sandbox]: reach_private: \"::ffff:10.0.0.1\": an IPv4-mapped address"},
		{head + "binaries = []\nreach_private = \"10.0.0.1\"\n", "c.toml:4:18: [sandbox]: reach_private must be an array"},
		{head + "binaries = []\nreach_private = [10]\n", "c.toml:4:18: [sandbox]: reach_private: 10 is not a string"},
		{"sandbox = 1\n", "c.toml:1:11: [sandbox] must be a table"},
		{"[exec.\"usr/bin/curl\"]\nwhen = \"tui\"\naction = \"allow\"\n", "c.toml:1:1: [exec.\"usr/bin/curl\"]: an exec key is an absolute path"},
		{"[exec.\"/usr/bin/../bin/curl\"]\nwhen = \"tui\"\naction = \"allow\"\n", "c.toml:1:1: [exec.\"/usr/bin/../bin/curl\"]: a key must not hold a \"..\" segment"},
		{"[exec.\"/usr/bin/curl\"]\nwhen = \"tui\"\naction = \"load\"\n", "c.toml:3:11: [exec.\"/usr/bin/curl\"]: action must be \"allow\" or \"deny\""},
		{"[exec.\"/usr/bin/curl\"]\nwhen = \"tui\"\naction = \"allow\"\nmode = \"xor\"\n", "c.toml:4:9: [exec.\"/usr/bin/curl\"]: mode must be"},
		{"[exec.\"/usr/bin/curl\"]\nwhen = \"tui\"\n", "c.toml:1:1: [exec.\"/usr/bin/curl\"]: action is required"},
		{"[exec.\"/usr/bin/curl\"]\naction = \"allow\"\nwhen = \"discord:dm:\"\n", "c.toml:3:9: [exec.\"/usr/bin/curl\"]: condition"},
		{"[exec]\n\"/a\" = {when = \"tui\", action = \"allow\", x = 1}\n", "c.toml:2:41: [exec.\"/a\"]: unknown key \"x\""},
		{"[execs.\"/a\"]\nwhen = \"tui\"\naction = \"allow\"\n", "c.toml:1:1: unknown table [execs]"},
	} {
		_, err := Parse("c.toml", []byte(tc.text))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q:\n error %v\n want prefix %q", tc.text, err, tc.want)
		}
	}
}

// TestExecRules: the four steps on the exec space, and binaries on top.
func TestExecRules(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	dm := set(t, "discord:dm", "discord:dm:5", "discord:channel:5")
	guild := set(t, "discord:guild:1", "discord:channel:7")
	nsfw := set(t, "discord:guild:1", "discord:channel:7", "discord:nsfw")
	internal, tui := set(t, "internal"), set(t, "tui")
	for _, tc := range []struct {
		ctx  cctx.Set
		path string
		want bool
		why  string
	}{
		{dm, "/usr/bin/cat", true, "step 2: allow holds"},
		{guild, "/usr/bin/cat", false, "step 3: a rule matched, none held"},
		{internal, "/usr/bin/curl", true, "step 2"},
		{dm, "/usr/bin/curl", false, "step 3"},
		{guild, "/bin/sh", true, "step 4: no rule matches"},
		{guild, "/usr/bin/ls", true, "step 4"},
		{guild, "/usr/bin/nc", false, "not listed"},
		{guild, "/usr/lib/git-core/git-remote-http", false, "listed directory, step 3: the prefix deny matched, no allow held"},
		{nsfw, "/usr/lib/git-core/git-remote-http", false, "step 1"},
		{tui, "/usr/lib/git-core/git-upload-pack", true, "step 2"},
		{set(t, "tui", "discord:nsfw"), "/usr/lib/git-core/git-upload-pack", false, "step 1 beats a narrower allow"},
		{guild, "/usr/lib/git-core/git-upload-pack", false, "step 3: the exact allow matched and did not hold"},
		{guild, "/usr/lib/git-core", false, "a listed directory itself is not a file beneath it"},
		{guild, "/usr/lib/git-corex/y", false, "not beneath the listed directory"},
		{guild, "/workspace/bin/build.sh", true, "view file, allowed, visible"},
		{nsfw, "/workspace/bin/build.sh", false, "step 3 on a view file"},
		{guild, "/workspace/bin/private/x", false, "the view hides it"},
		{tui, "/workspace/bin/private/x", true, "the view shows it"},
		{guild, "/workspace/other.sh", false, "not listed"},
		{guild, "/memories/bin/x", false, "not listed"},
		{guild, "/usr/bin/../bin/ls", false, "not canonical"},
		{guild, "/usr/bin/ls/", false, "not canonical"},
		{guild, "//usr/bin/ls", false, "not canonical"},
		{guild, "usr/bin/ls", false, "relative"},
		{guild, "/usr/bin/ls\x00", false, "NUL"},
		{guild, "/", false, "the root"},
		{guild, "", false, "empty"},
	} {
		if got := c.ExecAllowed(tc.ctx, tc.path); got != tc.want {
			t.Errorf("ExecAllowed(%v, %q) = %v, want %v (%s)", tc.ctx, tc.path, got, tc.want, tc.why)
		}
		ex, err := c.ExplainExec(tc.path, tc.ctx)
		if err == nil && c.ExecAllowed(tc.ctx, ex.Path) != (ex.Decision == "allow") {
			t.Errorf("ExplainExec(%q) = %+v, disagrees with ExecAllowed(%q)", tc.path, ex, ex.Path)
		}
	}

	// No [sandbox]: exec rules alone allow nothing.
	rulesOnly := mustParse(t, "[exec.\"/\"]\nwhen = \"tui\"\naction = \"allow\"\n")
	if rulesOnly.ExecAllowed(tui, "/bin/sh") {
		t.Fatal("no [sandbox] allowed /bin/sh")
	}
	if ex, _ := rulesOnly.ExplainExec("/bin/sh", tui); ex.Decision != "deny" || !strings.Contains(ex.Why, "no binaries are allowed") {
		t.Fatalf("%+v", ex)
	}

	// "/" lists everything; the exec rules still decide.
	all := mustParse(t, "[sandbox]\nbinaries = [\"/\"]\n[exec.\"/usr/\"]\nwhen = \"tui\"\naction = \"allow\"\n")
	if !all.ExecAllowed(guild, "/opt/x") || all.ExecAllowed(guild, "/usr/bin/x") || !all.ExecAllowed(tui, "/usr/bin/x") {
		t.Fatal("binaries = [\"/\"]")
	}
}

func TestAllowedBinaries(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	names := []string{"/bin/sh", "/usr/bin/cat", "/usr/bin/curl", "/usr/bin/nc", "/usr/lib/git-core/git", "/usr/bin/cat"}
	for _, tc := range []struct {
		ctx  []string
		want []string
	}{
		{[]string{"discord:dm", "discord:dm:5", "discord:channel:5"}, []string{"/bin/sh", "/usr/bin/cat", "/usr/bin/cat"}},
		{[]string{"internal"}, []string{"/bin/sh", "/usr/bin/curl"}},
		{[]string{"discord:guild:1", "discord:channel:7", "discord:nsfw"}, []string{"/bin/sh"}},
	} {
		if got := c.AllowedBinaries(set(t, tc.ctx...), names); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.ctx, got, tc.want)
		}
	}
	if got := mustParse(t, "").AllowedBinaries(set(t), names); got == nil || len(got) != 0 {
		t.Fatalf("no sandbox: %q", got)
	}
}

func TestExplainExec(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	guild := set(t, "discord:guild:1")
	for _, tc := range []struct {
		path, decision, why string
		rules               int
	}{
		{"/usr/bin/cat", "deny", "no matching rule's condition holds", 1},
		{"/usr/bin/nc", "deny", "/usr/bin/nc is not listed in [sandbox] binaries", 0},
		{"/usr/bin/../bin/ls", "allow", "no rule matches the path", 0},
		{"/workspace/bin/private/x", "deny", "the view hides /workspace/bin/private/x", 1},
		{"/usr/lib/git-core/git-upload-pack", "deny", "no matching rule's condition holds", 2},
	} {
		ex, err := c.ExplainExec(tc.path, guild)
		if err != nil || ex.Decision != tc.decision || ex.Why != tc.why || len(ex.Rules) != tc.rules {
			t.Errorf("%s: %+v %v", tc.path, ex, err)
		}
	}
	for _, bad := range []string{"usr/bin/cat", "", "/a\x00"} {
		if _, err := c.ExplainExec(bad, guild); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseRuleSpace(t *testing.T) {
	if _, err := ParseSpace("exec"); err == nil {
		t.Fatal("ParseSpace answers exec: a view would show it")
	}
	for _, name := range []string{"memories", "workspace", "exec"} {
		sp, err := ParseRuleSpace(name)
		if err != nil || sp.String() != name {
			t.Errorf("%s: %v %v", name, sp, err)
		}
	}
	if _, err := ParseRuleSpace("sandbox"); err == nil {
		t.Fatal("sandbox accepted")
	}
	for _, sp := range Spaces {
		if sp == Exec {
			t.Fatal("Spaces lists exec")
		}
	}
}

// TestExecAllowedAllocs: ExecAllowed may run for every execve.
func TestExecAllowedAllocs(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	dm := set(t, "discord:dm", "discord:dm:5", "discord:channel:5")
	for _, p := range []string{"/usr/bin/cat", "/usr/lib/git-core/git-remote-http", "/workspace/bin/private/x", "/usr/bin/nc", "/usr/bin/../x"} {
		if n := testing.AllocsPerRun(100, func() { c.ExecAllowed(dm, p) }); n != 0 {
			t.Errorf("ExecAllowed(%s): %v allocs", p, n)
		}
	}
}

// TestExecPathOK: execPathOK accepts exactly the canonical absolute paths.
func TestExecPathOK(t *testing.T) {
	for _, p := range []string{"/", "", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/.", "/a\x00", "/a/b/.", "a/b"} {
		if execPathOK(p) {
			t.Errorf("%q accepted", p)
		}
	}
	for _, p := range []string{"/a", "/a/b", "/.a", "/a/...", "/a..b/c"} {
		if c, _ := Canon(p); !execPathOK(p) || c != p {
			t.Errorf("%q refused (Canon %q)", p, c)
		}
	}
}

func BenchmarkExecAllowed(b *testing.B) {
	c := mustParse(b, sandboxDesign)
	dm := set(b, "discord:dm", "discord:dm:5", "discord:channel:5")
	b.ReportAllocs()
	for b.Loop() {
		c.ExecAllowed(dm, "/usr/lib/git-core/git-remote-http")
	}
}

// TestDirectoryAllowed: a listed directory ("/d/") is executable as a whole
// only in a context where every path beneath it is allowed. Before, a name
// ending in "/" was never allowed, so no listed directory ever ran.
func TestDirectoryAllowed(t *testing.T) {
	c := mustParse(t, sandboxDesign)
	names := []string{"/usr/lib/git-core/", "/workspace/bin/", "/usr/bin/", "/workspace/bin/private/", "/usr/lib/git-core"}
	for _, tc := range []struct {
		ctx  []string
		want []string
	}{
		// Outside tui, git-upload-pack matches an allow rule that does not
		// hold; /bin/private/ is hidden by the view.
		{[]string{"discord:dm"}, []string{"/workspace/bin/"}},
		// In tui /bin/private/ is shown; git-core's other files match the
		// nsfw rule without it holding: blocked, so the directory is not.
		{[]string{"tui"}, []string{"/workspace/bin/", "/workspace/bin/private/"}},
		{[]string{"discord:nsfw"}, []string{}},
	} {
		if got := c.AllowedBinaries(set(t, tc.ctx...), names); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.ctx, got, tc.want)
		}
	}
	// A directory listed nowhere, or above a listed one, is not allowed.
	c = mustParse(t, "[sandbox]\nbinaries = [\"/opt/tools/\", \"/opt/x/y/\"]\n[exec.\"/opt/tools/bin/\"]\nwhen = \"internal\"\naction = \"allow\"\n")
	for name, want := range map[string]bool{"/opt/tools/": true, "/opt/tools/bin/": true, "/opt/x/": false, "/opt/x/y/": true, "/opt/x/y/z/": true, "/opt/tools//": false} {
		if got := c.ExecAllowed(set(t, "internal"), name); got != want {
			t.Errorf("internal: %s: %v, want %v", name, got, want)
		}
	}
	// In tui /opt/tools/bin/ is not allowed, so neither is /opt/tools/ as a
	// whole; /opt/x/y/ has no rule.
	if c.ExecAllowed(set(t, "tui"), "/opt/tools/bin/") || c.ExecAllowed(set(t, "tui"), "/opt/tools/") || !c.ExecAllowed(set(t, "tui"), "/opt/x/y/") {
		t.Error("tui: /opt/tools/ and its bin/ are ruled for internal only; /opt/x/y/ has no rule")
	}
}

// TestExecListed: the paths of the view a run may ever execute, whatever
// the context: at or beneath a listed view directory, or a listed view
// file; and the directories that hold them.
func TestExecListed(t *testing.T) {
	c := mustParse(t, "[sandbox]\nbinaries = [\"/bin/sh\", \"/workspace/bin/\", \"/workspace/tools/run.sh\", \"/memories/m/x\"]\n[exec.\"/workspace/bin/\"]\nwhen = \"tui\"\naction = \"allow\"\n")
	for _, tc := range []struct {
		sp           Space
		p            string
		listed, hold bool
	}{
		{Workspace, "/", false, true},
		{Workspace, "/bin", true, false},
		{Workspace, "/bin/a/b", true, false},
		{Workspace, "/binx", false, false},
		{Workspace, "/tools", false, true},
		{Workspace, "/tools/run.sh", true, false},
		{Workspace, "/tools/run.sh/x", false, false},
		{Workspace, "/tools/other", false, false},
		{Memories, "/m", false, true},
		{Memories, "/m/x", true, false},
		{Memories, "/bin", false, false},
		{Exec, "/bin/sh", false, false},
	} {
		if got := c.ExecListed(tc.sp, tc.p); got != tc.listed {
			t.Errorf("ExecListed(%v, %s) = %v", tc.sp, tc.p, got)
		}
		if got := c.HoldsExecListed(tc.sp, tc.p); got != tc.hold {
			t.Errorf("HoldsExecListed(%v, %s) = %v", tc.sp, tc.p, got)
		}
	}
	if e := Empty(); e.ExecListed(Workspace, "/bin") || e.HoldsExecListed(Workspace, "/") {
		t.Error("no [sandbox]: nothing is listed")
	}
}
