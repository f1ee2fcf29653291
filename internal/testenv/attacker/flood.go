package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// flood opens n connections to the control socket at p and holds them: the
// even ones idle, the odd ones with half a request line (slowloris). It
// prints one JSON line, how many the daemon kept open and how many it
// answered with an error line (the first such line too), then holds every
// connection until stdin closes.
func flood(p string, n int) {
	var conns []net.Conn
	dialFailed := 0
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("unix", p, 2*time.Second)
		if err != nil {
			dialFailed++
			continue
		}
		if i%2 == 1 {
			c.Write([]byte(`{"jsonrpc":"2.0","id":1,`))
		}
		conns = append(conns, c)
	}
	// A refused connection has its error line waiting (or is closed);
	// one the daemon serves has nothing to say. One deadline for all, each
	// read in its own goroutine (a read past its deadline reads nothing).
	deadline := time.Now().Add(3 * time.Second)
	var out struct {
		Held       int    `json:"held"`
		Refused    int    `json:"refused"`
		Closed     int    `json:"closed"`
		DialFailed int    `json:"dial_failed"`
		First      string `json:"first_refusal"`
	}
	out.DialFailed = dialFailed
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			line, err := bufio.NewReader(c).ReadString('\n')
			mu.Lock()
			defer mu.Unlock()
			switch {
			case line != "":
				out.Refused++
				if out.First == "" {
					out.First = strings.TrimSpace(line)
				}
			case err == io.EOF:
				out.Closed++
			default:
				out.Held++
			}
		}()
	}
	wg.Wait()
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

func floodArgs() (string, int) {
	n, err := strconv.Atoi(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood SOCKET N")
		os.Exit(2)
	}
	return os.Args[2], n
}

// bigDecide sends, on each of n connections to the control socket at p,
// rounds tool.decide requests of 1 MiB whose arguments are arrays of
// 10,000 zeros (within the spec's array bound; the most values per byte),
// all at once. It prints how many were answered and the first answer.
func bigDecide(p string, n, rounds int) {
	inner := "[" + strings.Repeat("0,", 9999) + "0]"
	parts := make([]string, 0, 60)
	for size := 0; size < 1<<20-len(inner)-200; size += len(inner) + 1 {
		parts = append(parts, inner)
	}
	line := []byte(`{"jsonrpc":"2.0","id":1,"method":"tool.decide","params":{"tool":"t","args":{"a":[` + strings.Join(parts, ",") + `]}}}` + "\n")
	var mu sync.Mutex
	var wg sync.WaitGroup
	answered, first := 0, ""
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("unix", p, 2*time.Second)
			if err != nil {
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			for range rounds {
				c.SetDeadline(time.Now().Add(2 * time.Minute))
				if _, err := c.Write(line); err != nil {
					return
				}
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				mu.Lock()
				answered++
				if first == "" {
					first = strings.TrimSpace(l)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b, _ := json.Marshal(map[string]any{"answered": answered, "first": first})
	fmt.Println(string(b))
}
