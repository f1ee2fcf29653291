// Command testserver is a real MCP server (the official Go SDK, stdio
// transport) for the proxy's tests. Every tool call it receives is appended
// to the file named by $CALL_LOG, so a test can prove that a denied call
// never reached it. It lists 30 tools, 10 to a page, so that tools/list
// paginates.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var logMu sync.Mutex

func record(name string) {
	logMu.Lock()
	defer logMu.Unlock()
	f, err := os.OpenFile(os.Getenv("CALL_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, name)
}

type textIn struct {
	Text string `json:"text,omitempty"`
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func main() {
	s := mcp.NewServer(&mcp.Implementation{Name: "condfs-testserver", Version: "1"}, &mcp.ServerOptions{PageSize: 10})
	simple := func(name, answer string) {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: name}, func(ctx context.Context, req *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			record(name)
			return text(answer + in.Text), nil, nil
		})
	}
	simple("echo", "echo:")
	simple("secret", "the secret")
	simple("ask", "asked")
	// roots asks the client for its roots: on protocol 2026-07-28, a
	// server's request to the client travels in the call's result (multi
	// round-trip) and the client calls again with the answer.
	mcp.AddTool(s, &mcp.Tool{Name: "roots", Description: "asks the client for its roots"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		if len(req.Params.InputResponses) == 0 {
			record("roots-asked")
			//lint:ignore SA1019 roots is deprecated but served; the test needs a server request to the client
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"roots": &mcp.ListRootsParams{}}}, nil, nil
		}
		//lint:ignore SA1019 see above
		list, _ := req.Params.InputResponses["roots"].(*mcp.ListRootsResult)
		if list == nil {
			return nil, nil, fmt.Errorf("no roots in the answer")
		}
		record("roots")
		return text(fmt.Sprintf("roots:%d", len(list.Roots))), nil, nil
	})
	for i := 0; i < 26; i++ {
		simple(fmt.Sprintf("t%02d", i), "t")
	}
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Print(err)
	}
}
