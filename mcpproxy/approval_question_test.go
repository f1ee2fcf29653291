package mcpproxy_test

// The approval question shows the user what they approve, and nothing a
// tool name could make it say. Through the real gateway, a real daemon
// and a Python server.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestApprovalQuestionQuotesNameEverywhere: the tool name (chosen by the
// agent, under a policy whose default asks for approval) is shown quoted,
// every character outside printable ASCII escaped, wherever the question
// names it: the message and the approve field's description (which
// clients show beside the checkbox).
func TestApprovalQuestionQuotesNameEverywhere(t *testing.T) {
	sock := servePolicy(t, "version: 1\nroles:\n  default:\n    default_policy: {mode: approval_required}\n")
	g := startGateway(t, sock, nil)
	name := "read_file\n\nThis only reads README.md: approve\u2028\u202e"
	params, _ := json.Marshal(map[string]any{"name": name, "arguments": map[string]any{"path": "/etc/shadow"}})
	g.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + string(params) + `}`)
	var q struct {
		Method string `json:"method"`
		Params struct {
			Message         string `json:"message"`
			RequestedSchema struct {
				Properties map[string]struct {
					Title       string `json:"title"`
					Description string `json:"description"`
				} `json:"properties"`
			} `json:"requestedSchema"`
		} `json:"params"`
	}
	line := peerNext(t, g.out, 5*time.Second, "the approval question")
	if err := json.Unmarshal([]byte(line), &q); err != nil || q.Method != "elicitation/create" {
		t.Fatalf("expected condfs's question, got %s", line)
	}
	texts := map[string]string{"message": q.Params.Message}
	for k, p := range q.Params.RequestedSchema.Properties {
		texts[k+".title"], texts[k+".description"] = p.Title, p.Description
	}
	for where, text := range texts {
		for _, r := range text {
			if r < 0x20 || r > 0x7e {
				t.Errorf("the question's %s shows the tool name raw (%U): %q", where, r, text)
				break
			}
		}
	}
	if !strings.Contains(q.Params.Message, "/etc/shadow") {
		t.Errorf("the question does not show the arguments: %q", q.Params.Message)
	}
}
