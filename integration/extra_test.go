package integration

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAuditLog: every tool decision and every denied path goes to the
// --audit file as one JSON line with the session, atoms, target, decision
// and the deciding rule or reasons.
func TestAuditLog(t *testing.T) {
	h := newHome(t, privateRule, e2ePolicy)
	h.write("memories/private/p.md", "p")
	audit := h.path("audit.jsonl")
	d := startDaemon(t, h, "--audit", audit)
	mnt := d.open("s", guildCtx)
	var dec struct{ Decision string }
	d.setContext("s", []string{"discord:guild:9", "discord:channel:3"})
	d.call("tool.decide", map[string]any{"session": "s", "tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	d.call("path.check", map[string]any{"session": "s", "space": "memories", "path": "/private/p.md"}, nil)
	os.WriteFile(mnt+"/memories/private.md", nil, 0o644) // allowed: not audited as a deny
	os.ReadDir(mnt + "/memories")                        // hides private/ without naming it: no record
	if _, err := os.Stat(mnt + "/memories/private/p.md"); err == nil {
		t.Fatal("a denied path is visible")
	}
	if err := os.Mkdir(mnt+"/memories/private", 0o755); err == nil {
		t.Fatal("mkdir of a denied path succeeded")
	}
	d.stop()
	data, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	var kinds, ops, flushed []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line is not JSON: %q", line)
		}
		if rec["session"] != "s" || rec["decision"] == nil || rec["atoms"] == nil {
			t.Fatalf("audit record lacks session, atoms or decision: %v", rec)
		}
		// Records carry the context in force when they were decided.
		if a := fmt.Sprint(rec["atoms"]); a != "[discord:channel:3 discord:guild:9]" {
			t.Fatalf("audit record with atoms %s, want the switched context", a)
		}
		if rec["flushed"] == true {
			// Told at the session's close: the repeats of a record
			// that no later record of it told.
			flushed = append(flushed, fmt.Sprint(rec["op"], " ", rec["suppressed"]))
			continue
		}
		switch rec["kind"] {
		case "tool":
			if rec["tool"] != "refund" || rec["decision"] != "deny" || rec["reasons"] == nil {
				t.Fatalf("tool record: %v", rec)
			}
		case "path":
			if rec["path"] != "/private/p.md" && rec["path"] != "/private" {
				t.Fatalf("path record: %v", rec)
			}
		}
		kinds = append(kinds, rec["kind"].(string)+":"+rec["decision"].(string))
		if op, ok := rec["op"].(string); ok {
			ops = append(ops, op)
		}
	}
	got := strings.Join(kinds, " ")
	for _, want := range []string{"tool:deny", "path:deny"} {
		if !strings.Contains(got, want) {
			t.Fatalf("audit has %q, want a %s record", got, want)
		}
	}
	// path.check, the stat (a lookup), and the mkdir (the kernel's lookup
	// of the same name within a second is suppressed by the rate limit,
	// then the create); the listing that hid private/ named nothing.
	if o := strings.Join(ops, " "); o != "check lookup create" {
		t.Fatalf("denied path records by op: %q", o)
	}
	// The suppressed lookup is counted: told when the session closed.
	if f := strings.Join(flushed, ", "); f != "lookup 1" {
		t.Fatalf("records told at the close: %q, want the suppressed lookup", f)
	}
}

// TestBackingModesHold: with allow_other, another user gains nothing
// through the view that the backing modes deny (default_permissions).
func TestBackingModesHold(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv: %v", err)
	}
	h := newHome(t, "", "version: 1\n")
	h.write("workspace/open.txt", "open")
	h.write("workspace/secret.txt", "secret")
	os.Chmod(h.path("workspace/secret.txt"), 0o600)
	d := startDaemon(t, h)
	mnt := h.path("mnt/s")
	d.call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "allow_uids": []int{65534}}, nil)
	for dir := mnt; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, h.root) || dir == filepath.Dir(h.root) {
			os.Chmod(dir, 0o755)
		}
	}
	as := func(args ...string) (string, error) {
		out, err := exec.Command(setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := as("cat", mnt+"/workspace/open.txt"); err != nil || out != "open" {
		t.Fatalf("nobody cannot read a world-readable file: %q %v", out, err)
	}
	if out, err := as("cat", mnt+"/workspace/secret.txt"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody read a 0600 root file through the view: %q %v", out, err)
	}
	if out, err := as("touch", mnt+"/workspace/new.txt"); err == nil {
		t.Fatalf("nobody created a file in a root-owned 0755 directory: %q", out)
	}
}

// TestBackingACLsHold: the kernel decides on its own what it has cached (a
// path walk through cached entries, a stat of cached attributes), for every
// uid the view admits. It must use the backing's POSIX ACLs there, as
// natively: with mode bits alone, uid 65534, which an ACL entry denies on a
// 0755 directory, could stat a file in it once root had looked it up, and
// an ACL entry granting it a 0700 directory was refused.
func TestBackingACLsHold(t *testing.T) {
	h := newHome(t, "", "version: 1\n")
	h.write("workspace/denied/f.txt", "d")
	h.write("workspace/granted/f.txt", "g")
	d := startDaemon(t, h)
	mnt := h.path("mnt/s")
	d.call("session.open", map[string]any{"id": "s", "mount": mnt, "context": []string{"tui"}, "allow_uids": []int{nobody}}, nil)
	for dir := mnt; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, h.root) || dir == filepath.Dir(h.root) {
			os.Chmod(dir, 0o755)
		}
	}
	os.Chmod(h.path("workspace/denied"), 0o755)
	setACL(t, h.path("workspace/denied"), 7, 0, 5, 5)
	os.Chmod(h.path("workspace/granted"), 0o700)
	setACL(t, h.path("workspace/granted"), 7, 5, 0, 0)
	stat := func(p string) error {
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "stat", "-c", "%s", p).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if stat(h.path("workspace/denied/f.txt")) == nil || stat(h.path("workspace/granted/f.txt")) != nil {
		t.Fatal("the ACLs do not decide natively as this test expects")
	}
	for _, name := range []string{"denied", "granted"} {
		// Root looks it up first: the entries are in the kernel's cache.
		if _, err := os.Stat(mnt + "/workspace/" + name + "/f.txt"); err != nil {
			t.Fatal(err)
		}
	}
	if err := stat(mnt + "/workspace/denied/f.txt"); err == nil {
		t.Fatal("uid 65534 stat'd, through entries root had cached, a file in a directory a POSIX ACL denies it")
	}
	if err := stat(mnt + "/workspace/granted/f.txt"); err != nil {
		t.Fatalf("uid 65534 could not stat a file in a 0700 directory a POSIX ACL grants it: %v", err)
	}
}

// TestCreateModesFollowUmask: files and directories made through a view
// get the caller's mode less its umask, as natively (the daemon runs with
// umask 0; with FUSE_POSIX_ACL negotiated the kernel still applies the
// caller's umask, as no FUSE_DONT_MASK is asked for).
func TestCreateModesFollowUmask(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o027))
	h := newHome(t, "", "version: 1\n")
	d := startDaemon(t, h)
	mnt := d.open("s", []string{"tui"})
	if err := os.WriteFile(mnt+"/workspace/f", nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt+"/workspace/d", 0o777); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"f": 0o640, "d": 0o750} {
		st, err := os.Stat(h.path("workspace/" + name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Fatalf("%s made with umask 027: %v, want %v", name, st.Mode().Perm(), want)
		}
	}
}

// setACL sets a directory's access ACL: the owner's, uid 65534's, the owning
// group's and others' permissions (the mask is the group class's union).
// Written as the system.posix_acl_access xattr, so no acl tools are needed.
func setACL(t *testing.T, dir string, owner, nobodyPerm, group, other uint16) {
	t.Helper()
	const undefined = 0xffffffff
	entries := []struct {
		tag, perm uint16
		id        uint32
	}{
		{0x01, owner, undefined},              // ACL_USER_OBJ
		{0x02, nobodyPerm, nobody},            // ACL_USER
		{0x04, group, undefined},              // ACL_GROUP_OBJ
		{0x10, group | nobodyPerm, undefined}, // ACL_MASK
		{0x20, other, undefined},              // ACL_OTHER
	}
	b := binary.LittleEndian.AppendUint32(nil, 2) // POSIX_ACL_XATTR_VERSION
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	if err := unix.Setxattr(dir, "system.posix_acl_access", b, 0); err != nil {
		t.Fatalf("set the ACL of %s: %v", dir, err)
	}
}

// TestCtl drives the daemon with condfs ctl, for people and with --json.
func TestCtl(t *testing.T) {
	h := newHome(t, e2eConditions, e2ePolicy)
	h.write("blocks/conditional/dm.md", "+++\ndescription = \"dm block\"\n+++\nbe kind\n")
	d := startDaemon(t, h)
	ctl := func(args ...string) string {
		out, err := exec.Command(condfsBin, append([]string{"ctl", "--socket", d.socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	mnt := h.path("mnt/c")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"open", "c", mnt, "--context", "discord:dm", "--context", "discord:dm:7"}, "session c mounted at " + mnt},
		{[]string{"list"}, "discord:dm discord:dm:7"},
		{[]string{"context", "c"}, "context: discord:dm discord:dm:7"},
		{[]string{"blocks", "c"}, "== dm: dm block\nbe kind"},
		{[]string{"check", "c", "memories", "/private/x"}, "/private/x: allow (allow rule /private/ holds)"},
		{[]string{"decide", "--session", "c", "--tool", "refund", "--args", `{"amount": 500}`}, "allow (role default)"},
		{[]string{"context", "c", "discord:guild:1", "discord:channel:2"}, "context: discord:channel:2 discord:guild:1"},
		{[]string{"decide", "--session", "c", "--tool", "refund", "--args", `{"amount": 500}`}, "deny (role -)\n  because constraint"},
		{[]string{"--json", "status"}, `"generation":1`},
		{[]string{"reload"}, "conditions:"},
		{[]string{"close", "c"}, "closed"},
	} {
		if out := ctl(tc.args...); !strings.Contains(out, tc.want) {
			t.Fatalf("ctl %v:\n%s\nwant %q", tc.args, out, tc.want)
		}
	}
	out, err := exec.Command(condfsBin, "ctl", "--socket", d.socket, "context", "nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown session "nope": open it with session.open`) {
		t.Fatalf("unknown session: %v %s", err, out)
	}
	out, err = exec.Command(condfsBin, "ctl", "--socket", h.path("no.sock"), "status").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is condfs serve running?") {
		t.Fatalf("no daemon: %v %s", err, out)
	}
}
