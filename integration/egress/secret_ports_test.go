package egress

import (
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestSecretGoesOnlyToItsPort: secret gh lists "api.test", which means
// port 443: a request to api.test:8443 (inspected, and allowed by the
// policy, which names no port) carrying the placeholder is a refused
// leak attempt (403, audited), over HTTP/1.1 and HTTP/2, and nothing is
// dialled for it; the same request to port 443 carries the value.
func TestSecretGoesOnlyToItsPort(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	const c = `curl -sS -i --max-time 10 --noproxy '*' -H "Authorization: Bearer $GH_TOKEN" `
	out, _ := testenv.CondfsRun(t, d, "", "--", "sh", "-c", c+`--http1.1 https://api.test:8443/port-h1; echo; `+c+`--http2 https://api.test:8443/port-h2; echo; `+c+`https://api.test/port-443`)
	noValue(t, "the run's output", out)
	if strings.Count(out, "the secret does not list api.test:8443") != 2 || !strings.Contains(out, "HTTP/1.1 403") || !strings.Contains(out, "HTTP/2 403") {
		t.Errorf("the placeholder toward another port was not refused on both protocols:\n%s", out)
	}
	if !strings.Contains(out, "seen api.test GET /port-443 auth=ok") {
		t.Errorf("the secret was not put into a request to its port:\n%s", out)
	}
	logs := d.Log()
	noValue(t, "the daemon's log", logs)
	if !strings.Contains(logs, `"port":8443,"protocol":"https","method":"GET","path":"/port-h1","decision":"allow","reasons":[],"refused":"leak attempt: the placeholder of secret gh in a request to api.test: the secret does not list api.test:8443"`) {
		t.Errorf("the leak attempt is not audited:\n%s", testenv.Tail(logs, 20))
	}
	if seen := ih.srv.saw(); strings.Contains(seen, "/port-h") {
		t.Errorf("HOLE: the server read a refused request:\n%s", seen)
	}
}
