package testenv

// PyCall is a Python prelude: call(sock, method, params) sends one
// request and returns the answer as a dict.
const PyCall = `
import json, socket, sys, os, time
def conn(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, s.makefile("rb")
def call(c, method, params, i=[0]):
    s, f = c
    i[0] += 1
    s.sendall((json.dumps({"jsonrpc": "2.0", "id": i[0], "method": method, "params": params}) + "\n").encode())
    return json.loads(f.readline())
`

// PrivateRule hides /memories/private/ outside DMs.
const PrivateRule = `
[memories."/private/"]
when = "discord:dm"
action = "allow"
`

var (
	DM    = []string{"discord:dm", "discord:dm:7", "discord:channel:7"}
	Guild = []string{"discord:guild:1", "discord:channel:2"}
)
