package mcpproxy_test

// An answer is passed on only to the request it answers: the promise
// that tools/list shows only what the session can call rests on it.
// Through the real gateway, a real daemon and a Python server.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/mcpproxy"
)

// noSecret fails if a listing of the denied tool reached the client.
func noSecret(t *testing.T, got []string, what string) {
	t.Helper()
	for _, l := range got {
		if strings.Contains(l, `"secret"`) {
			t.Errorf("%s: the client got a listing of a tool the policy denies: %s", what, l)
		}
	}
}

func refusedWith(got []string, why string) bool {
	for _, l := range got {
		if strings.Contains(l, `"error"`) && strings.Contains(l, why) {
			return true
		}
	}
	return false
}

// TestDuplicateListingIdRefused: a second tools/list under the id of one
// in flight is refused; the first is answered filtered.
func TestDuplicateListingIdRefused(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":30,"method":"tools/list"}`, `{"jsonrpc":"2.0","id":30,"method":"tools/list"}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "two tools/list under id 30")
	if !refusedWith(got, "already in flight") {
		t.Errorf("the second request under id 30 was not refused: %q", got)
	}
}

// TestSharedRequestIdRefused: a request under the id of another in flight
// is refused whatever either asks (a ping's answer took the listing's
// filter, and the listing passed unfiltered).
func TestSharedRequestIdRefused(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":31,"method":"ping"}`, `{"jsonrpc":"2.0","id":31,"method":"tools/list"}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "a ping and a tools/list under id 31")
	if !refusedWith(got, "already in flight") {
		t.Errorf("the tools/list under the ping's id was not refused: %q", got)
	}
	g.send(`{"jsonrpc":"2.0","id":32,"method":"tools/call","params":{"name":"t03","arguments":{}}}`, `{"jsonrpc":"2.0","id":32,"method":"tools/list"}`)
	got = g.collect(1500 * time.Millisecond)
	noSecret(t, got, "a tools/call and a tools/list under id 32")
	if !refusedWith(got, "already in flight") {
		t.Errorf("the tools/list under the call's id was not refused: %q", got)
	}
}

// TestNullIdRequestRefused: a request with id null is refused, never
// forwarded (its answer, id null too, passed unfiltered).
func TestNullIdRequestRefused(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":null,"method":"tools/list"}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "a tools/list with id null")
	if !refusedWith(got, "may not be null") {
		t.Errorf("a tools/list with id null was not refused: %q", got)
	}
	if strings.Contains(g.received(), `"id": null`) || strings.Contains(g.received(), `"id":null`) {
		t.Errorf("the server got the request with id null: %s", g.received())
	}
}

// TestUnaskedServerAnswerDropped: an answer from the server to no request
// in flight (never asked, or asked and answered already) never reaches the
// client.
func TestUnaskedServerAnswerDropped(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	// The server answers a request nobody made.
	g.send(`{"jsonrpc":"2.0","id":33,"method":"tools/call","params":{"name":"t03","arguments":{"say":[{"jsonrpc":"2.0","id":77,"result":{"tools":[{"name":"secret","inputSchema":{"type":"object"}}]}}]}}}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "an answer to id 77, never asked")
	if !strings.Contains(strings.Join(got, "\n"), `"id":33`) {
		t.Errorf("the call's own answer did not come: %q", got)
	}
	// A server that answers a listing twice: the second answer is not the
	// listing's (it was answered), and could be read as a later request's.
	g2 := startGateway(t, serve(t), []string{"ANSWER_TWICE=1"})
	g2.send(`{"jsonrpc":"2.0","id":34,"method":"tools/list"}`)
	got = g2.collect(1500 * time.Millisecond)
	noSecret(t, got, "a listing answered twice")
	if n := strings.Count(strings.Join(got, "\n"), `"id":34`); n != 1 {
		t.Errorf("the client got %d answers to id 34: %q", n, got)
	}
}

// TestServerRequestAnsweredOnce: the server's requests to the client are
// kept by id too: one under an id in flight is dropped, and the client's
// answer reaches the server only for a request it made, once.
func TestServerRequestAnsweredOnce(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	ask := `{"jsonrpc":"2.0","id":"r1","method":"roots/list"}`
	g.send(`{"jsonrpc":"2.0","id":35,"method":"tools/call","params":{"name":"t03","arguments":{"say":[` + ask + `,` + ask + `]}}}`)
	got := strings.Join(g.collect(1500*time.Millisecond), "\n")
	if n := strings.Count(got, `"id":"r1"`); n != 1 {
		t.Errorf("the client got the server's request r1 %d times: %s", n, got)
	}
	answer := `{"jsonrpc":"2.0","id":"%s","result":{"roots":[]}}`
	g.send(fmt.Sprintf(answer, "r1"), fmt.Sprintf(answer, "r1"), fmt.Sprintf(answer, "r9"))
	time.Sleep(500 * time.Millisecond)
	recv := g.received()
	if n := strings.Count(recv, `"roots":[]`); n != 1 || strings.Contains(recv, `"r9"`) {
		t.Errorf("the server got %d answers (want the one to r1, once): %s", n, recv)
	}
}

// TestRequestsInFlightBounded: at most MaxInFlight of the client's
// requests await an answer; one beyond is answered with an error.
func TestRequestsInFlightBounded(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	lines := make([]string, mcpproxy.MaxInFlight+1)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"hang"}`, 1000+i)
	}
	g.send(lines...)
	got := g.collect(2 * time.Second)
	if len(got) != 1 || !strings.Contains(got[0], fmt.Sprintf(`"id":%d`, 1000+mcpproxy.MaxInFlight)) || !strings.Contains(got[0], "too many requests in flight") {
		t.Errorf("%d requests that are never answered: the client got %.300q", len(lines), got)
	}
}

// TestIdsEqualAsTextRefused: 36 and "36" are one id to a reader that
// takes ids as text: a request under the other while one is in flight is
// refused, and an answer under the other form is not the request's.
func TestIdsEqualAsTextRefused(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":36,"method":"tools/list"}`, `{"jsonrpc":"2.0","id":"36","method":"ping"}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, `a tools/list 36 and a ping "36"`)
	if !refusedWith(got, "already in flight") {
		t.Errorf(`the ping under "36" was not refused: %q`, got)
	}
	g.send(`{"jsonrpc":"2.0","id":37,"method":"hang"}`)
	g.send(`{"jsonrpc":"2.0","id":38,"method":"tools/call","params":{"name":"t03","arguments":{"say":[{"jsonrpc":"2.0","id":"37","result":{"tools":[{"name":"secret","inputSchema":{"type":"object"}}]}}]}}}`)
	noSecret(t, g.collect(1500*time.Millisecond), `an answer under "37" to request 37`)
}

// TestListingShapedAnswerFiltered: an answer whose result lists tools is
// filtered whatever request it answers (a late answer to a cancelled
// tools/list is read as the answer of a later request under its id).
func TestListingShapedAnswerFiltered(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":42,"method":"hang"}`)
	g.send(`{"jsonrpc":"2.0","id":43,"method":"tools/call","params":{"name":"t03","arguments":{"say":[{"jsonrpc":"2.0","id":42,"result":{"tools":[{"name":"secret","inputSchema":{"type":"object"}}]}}]}}}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "a listing under the id of another request")
	if !strings.Contains(strings.Join(got, "\n"), `"id":42`) {
		t.Errorf("the answer to 42 did not come (filtered): %q", got)
	}
}

// TestCancelledRequestFreesItsId: a request the client cancels is no
// longer in flight (the server need not answer it): its id may be used
// again, and it holds no place among MaxInFlight.
func TestCancelledRequestFreesItsId(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	g.send(`{"jsonrpc":"2.0","id":50,"method":"hang"}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":50,"reason":"user"}}`,
		`{"jsonrpc":"2.0","id":50,"method":"ping"}`)
	got := g.collect(1500 * time.Millisecond)
	if len(got) != 1 || !strings.Contains(got[0], `"id":50,"result"`) {
		t.Errorf("a ping under the id of a cancelled request: %q", got)
	}
}

// TestServerRequestWithResultRefused: a message is a request, a
// notification or an answer, never two of them: the server's request
// that carries a result (a listing, under the id of the client's
// tools/list) never reaches the client, which could read it as the
// answer by its result; nor does an answer with a result and an error.
func TestServerRequestWithResultRefused(t *testing.T) {
	g := startGateway(t, serve(t), nil)
	listing := `{"tools":[{"name":"secret","inputSchema":{"type":"object"}}]}`
	g.send(`{"jsonrpc":"2.0","id":44,"method":"hang"}`)
	g.send(`{"jsonrpc":"2.0","id":45,"method":"tools/call","params":{"name":"t03","arguments":{"say":[` +
		`{"jsonrpc":"2.0","id":44,"method":"ping","result":` + listing + `},` +
		`{"jsonrpc":"2.0","id":"s1","method":"notifications/message","result":` + listing + `},` +
		`{"jsonrpc":"2.0","method":"notifications/message","error":{"code":1,"message":"x","data":` + listing + `}},` +
		`{"jsonrpc":"2.0","id":44,"error":{"code":1,"message":"x"},"result":` + listing + `}]}}}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, "a server's request or notification carrying a result")
	if !strings.Contains(strings.Join(got, "\n"), `"id":45`) {
		t.Errorf("the call's own answer did not come: %q", got)
	}
	// And from the client: refused, not forwarded.
	g.send(`{"jsonrpc":"2.0","id":46,"method":"ping","result":{}}`)
	if got := g.collect(1500 * time.Millisecond); !refusedWith(got, "a request, a notification or an answer") {
		t.Errorf("a client request with a result was not refused: %q", got)
	}
}

// TestListingKeyInAnotherCaseFiltered: a result key that folds to tools
// ("Tools") is a listing to a reader that folds case: it is filtered as
// one, and the client never gets two keys that fold alike.
func TestListingKeyInAnotherCaseFiltered(t *testing.T) {
	g := startGateway(t, serve(t), []string{"LIST_KEY=Tools"})
	g.send(`{"jsonrpc":"2.0","id":47,"method":"tools/list"}`)
	got := g.collect(1500 * time.Millisecond)
	noSecret(t, got, `a listing under "Tools"`)
	g.send(`{"jsonrpc":"2.0","id":48,"method":"hang"}`)
	g.send(`{"jsonrpc":"2.0","id":49,"method":"tools/call","params":{"name":"t03","arguments":{"say":[{"jsonrpc":"2.0","id":48,"result":{"TOOLS":[{"name":"secret","inputSchema":{"type":"object"}}]}}]}}}`)
	got = append(got, g.collect(1500*time.Millisecond)...)
	noSecret(t, got, `a listing under "TOOLS" answering another request`)
	for _, l := range got {
		if strings.Contains(l, `"Tools"`) || strings.Contains(l, `"TOOLS"`) {
			t.Errorf("the client got a key that folds to tools: %s", l)
		}
	}
}

// TestAnswerBeforeForwardDropped: a call being decided (its approval
// question pending) has not reached the server: an answer the server
// gives it, guessing its id, is dropped; the call is answered once, by
// the gateway.
func TestAnswerBeforeForwardDropped(t *testing.T) {
	g := startGateway(t, serve(t), nil, "--grace", "300ms")
	g.send(`{"jsonrpc":"2.0","id":51,"method":"tools/call","params":{"name":"ask","arguments":{}}}`)
	if q := peerNext(t, g.out, 5*time.Second, "the approval question"); !strings.Contains(q, "elicitation/create") {
		t.Fatalf("expected condfs's question, got %s", q)
	}
	g.send(`{"jsonrpc":"2.0","id":52,"method":"tools/call","params":{"name":"t03","arguments":{"say":[{"jsonrpc":"2.0","id":51,"result":{"content":[{"type":"text","text":"forged"}]}}]}}}`)
	got := g.collect(1500 * time.Millisecond)
	g.in.Close()
	got = append(got, g.collect(1500*time.Millisecond)...)
	all := strings.Join(got, "\n")
	if strings.Contains(all, "forged") {
		t.Errorf("the server's answer to a call it was never sent reached the client: %s", all)
	}
	if n := strings.Count(all, `"id":51`); n != 1 || !strings.Contains(all, "client is gone") {
		t.Errorf("the call pending approval was answered %d times (want once, denied): %s", n, all)
	}
}
