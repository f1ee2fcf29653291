package acl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cctx "github.com/condfs/condfs/context"
)

const egressOK = `[egress]
inspect = ["api.github.com", "*.example.com"]

[secrets.github]
hosts = ["api.github.com"]
value = "env:CONDFS_TEST_SECRET"
env = "GITHUB_TOKEN"
when = ["discord:dm"]

[secrets.any]
hosts = ["x.example.com", "*.a.example.com", "git.a.example.com:8443"]
value = "env:CONDFS_TEST_SECRET"
env = "ANY_TOKEN"
`

func TestEgressTables(t *testing.T) {
	t.Setenv("CONDFS_TEST_SECRET", "s3cr3t-value")
	c, err := Parse("conditions.toml", []byte(egressOK))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ReadValues(); err != nil {
		t.Fatal(err)
	}
	e := c.Egress()
	for h, want := range map[string]bool{"api.github.com": true, "github.com": false, "a.example.com": true, "a.b.example.com": true, "example.com": false, "xexample.com": false} {
		if e.Inspected(h) != want {
			t.Errorf("Inspected(%q) = %v", h, !want)
		}
	}
	gh := c.Secret("github")
	dm, _ := cctx.NewSet([]string{"discord:dm"})
	if gh.Value() != "s3cr3t-value" || !gh.Lists("api.github.com", 443) || gh.Lists("x.example.com", 443) || !gh.Holds(dm) || gh.Holds(cctx.Set{}) {
		t.Errorf("github: %v", gh)
	}
	// An entry without a port means 443 only; NAME:PORT that port only.
	if gh.Lists("api.github.com", 8443) || gh.Lists("api.github.com", 80) {
		t.Errorf("github is listed for a port its entry does not mean")
	}
	any := c.Secret("any")
	if !any.Holds(cctx.Set{}) || !any.Lists("b.a.example.com", 443) || any.Lists("a.example.com", 443) {
		t.Errorf("any: %v", any)
	}
	if !any.Lists("git.a.example.com", 8443) || any.Lists("x.example.com", 8443) || any.Lists("git.a.example.com", 9443) {
		t.Errorf("any: ports")
	}
	if strings.Contains(gh.String(), "s3cr3t") {
		t.Errorf("String shows the value")
	}
}

// TestEgressTableErrors: each fails to load with its position, and no
// error names a secret's value.
func TestEgressTableErrors(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CONDFS_TEST_SECRET", "s3cr3t-value")
	t.Setenv("CONDFS_TEST_BAD", "line\r\nX-Injected: 1")
	fifo := filepath.Join(dir, "fifo")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte("s3cr3t-value\n"), 0o600)
	noPEM := filepath.Join(dir, "ca.pem")
	os.WriteFile(noPEM, []byte("s3cr3t-value"), 0o600)
	sec := func(body string) string {
		return "[egress]\ninspect = [\"api.test\"]\n\n[secrets.s]\n" + body
	}
	cases := []struct{ name, toml, want string }{
		{"unknown egress key", "[egress]\ninspect = []\nhosts = 1\n", "3:"},
		{"inspect not a list", "[egress]\ninspect = \"api.test\"\n", "2:"},
		{"inspect upper case", "[egress]\ninspect = [\"API.test\"]\n", "2:"},
		{"inspect an address", "[egress]\ninspect = [\"10.0.0.1\"]\n", "2:"},
		{"inspect a bare wildcard", "[egress]\ninspect = [\"*.com\"]\n", "2:"},
		{"inspect a wildcard inside", "[egress]\ninspect = [\"a.*.com\"]\n", "2:"},
		{"relative upstream_ca", "[egress]\nupstream_ca = \"ca.pem\"\n", "2:"},
		{"secret host not inspected", sec("hosts = [\"other.test\"]\nvalue = \"env:CONDFS_TEST_SECRET\"\nenv = \"T\"\n"), "5:"},
		{"secret wildcard wider than inspect", "[egress]\ninspect = [\"*.a.test\"]\n[secrets.s]\nhosts = [\"*.test\"]\nvalue = \"env:X\"\nenv = \"T\"\n", "4:"},
		{"secret without egress", "[secrets.s]\nhosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\n", "2:"},
		{"secret value written in place", sec("hosts = [\"api.test\"]\nvalue = \"s3cr3t-value\"\nenv = \"T\"\n"), "6:"},
		{"secret relative file", sec("hosts = [\"api.test\"]\nvalue = \"file:secret\"\nenv = \"T\"\n"), "6:"},
		{"secret no env", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\n"), "4:"},
		{"secret reserved env", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"HTTPS_PROXY\"\n"), "7:"},
		{"secret unknown key", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\nheader = \"Authorization\"\n"), "8:"},
		{"secret bad when", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\nwhen = \"nowhere\"\n"), "8:"},
		{"secret mode without when", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\nmode = \"and\"\n"), "4:"},
		{"two secrets, one env", sec("hosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\n[secrets.t]\nhosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\n"), "11:"},
		{"secret host with a bad port", sec("hosts = [\"api.test:0443\"]\nvalue = \"env:X\"\nenv = \"T\"\n"), "5:"},
		{"secret host with port 0", sec("hosts = [\"api.test:0\"]\nvalue = \"env:X\"\nenv = \"T\"\n"), "5:"},
		{"secret bad name", "[egress]\ninspect = [\"api.test\"]\n[secrets.\"a b\"]\nhosts = [\"api.test\"]\nvalue = \"env:X\"\nenv = \"T\"\n", "3:"},
	}
	for _, c := range cases {
		_, err := Parse("conditions.toml", []byte(c.toml))
		if err == nil || !strings.HasPrefix(err.Error(), "conditions.toml:"+c.want) {
			t.Errorf("%s: %v, want an error at %s", c.name, err, c.want)
		}
	}
	reads := []struct{ name, toml, want string }{
		{"env value unset", sec("hosts = [\"api.test\"]\nvalue = \"env:CONDFS_TEST_UNSET\"\nenv = \"T\"\n"), "6:"},
		{"env value with CRLF", sec("hosts = [\"api.test\"]\nvalue = \"env:CONDFS_TEST_BAD\"\nenv = \"T\"\n"), "6:"},
		{"file value missing", sec("hosts = [\"api.test\"]\nvalue = \"file:" + dir + "/none\"\nenv = \"T\"\n"), "6:"},
		{"file value a FIFO", sec("hosts = [\"api.test\"]\nvalue = \"file:" + fifo + "\"\nenv = \"T\"\n"), "6:"},
		{"upstream_ca without a certificate", "[egress]\nupstream_ca = \"" + noPEM + "\"\n", "2:"},
		{"upstream_ca missing", "[egress]\nupstream_ca = \"" + dir + "/none.pem\"\n", "2:"},
	}
	for _, c := range reads {
		cfg, err := Parse("conditions.toml", []byte(c.toml))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		err = cfg.ReadValues()
		if err == nil || !strings.HasPrefix(err.Error(), "conditions.toml:"+c.want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want an error at %s", c.name, err, c.want)
		}
	}
	cfg, err := Parse("conditions.toml", []byte(sec("hosts = [\"api.test\"]\nvalue = \"file:"+secretFile+"\"\nenv = \"T\"\n")))
	if err != nil || cfg.ReadValues() != nil || cfg.Secret("s").Value() != "s3cr3t-value" {
		t.Errorf("a file value: %v", err)
	}
}
