#!/usr/bin/env bash
# The README demo: mount the example agent's view in a guild channel, switch
# to a DM, watch the view change (and what a command run in the session sees
# and may execute), list prompt blocks, undo what a command changed, hold an
# agent's command's changes back in a staged session and discard them, decide
# two tool calls.
# Usage: examples/demo.sh path/to/condfs   (as root: it mounts FUSE)
set -euo pipefail
bin=$(realpath "${1:-bin/condfs}")
home=$(cd "$(dirname "$0")/agent" && pwd)
tmp=$(mktemp -d /tmp/condfs-demo.XXXXXX)
sock=$tmp/run/condfs.sock
view=$tmp/view
log=$tmp/daemon.log

cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"; wait "$pid" || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

say() { printf '\n$ %s\n' "$*"; }
quote() { for a in "$@"; do case $a in *[!A-Za-z0-9_./:=-]*) printf "'%s' " "$a" ;; *) printf '%s ' "$a" ;; esac; done; }
ctl() { say "condfs ctl $(quote "$@")"; "$bin" ctl --socket "$sock" "$@"; }
show() { say "find view -type f"; (cd "$view" && find . -type f | sed 's|^\./||' | sort); }

say "condfs serve --root examples/agent --mount view --context discord:guild:123456789 --context discord:channel:555 &"
"$bin" serve --root "$home" --socket "$sock" --mount "$view" \
  --context discord:guild:123456789 --context discord:channel:555 --log-level warn 2>"$log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "daemon did not start:"; cat "$log"; exit 1; }

show
runit() { say "condfs run --session default -- $(quote "$@")"; "$bin" run --socket "$sock" --session default -- "$@" || echo "(exit $?)"; }
runit sh -c 'ls /memories; cat /memories/notes/team.md'
ctl context default '{"kind":"discord","channel_id":"42"}'
show
runit sh -c 'ls /memories; cat /memories/notes/team.md'
ctl blocks default
# A checkpoint, a command that breaks a file and adds one, what it changed,
# and the way back (docs/changes.md).
ctl checkpoint default --name before-edit
runit sh -c ': > /workspace/src/hello.py; echo "print(42)" > /workspace/src/new.py'
ctl diff default --content
ctl rollback default before-edit
show
runit cat /workspace/src/hello.py
# A staged session: an agent's command deletes a file; only its own view
# changes; the diff, then a discard (docs/changes.md).
ctl open agent "$tmp/agent" --context discord:guild:123456789 --context discord:channel:555 --changes staged
say "condfs run --session agent -- rm /workspace/src/hello.py"
"$bin" run --socket "$sock" --session agent -- rm /workspace/src/hello.py || echo "(exit $?)"
say "ls agent/workspace/src view/workspace/src"
ls "$tmp/agent/workspace/src"; echo "--- (the other session, and the backing tree:)"; ls "$view/workspace/src"
ctl diff agent
ctl discard agent
say "ls agent/workspace/src"
ls "$tmp/agent/workspace/src"
ctl close agent
ctl decide --session default --tool send_email --args '{"to": ["ann@acme.com"]}'
ctl decide --session default --tool send_email --args '{"to": ["ann@acme.com", "eve@evil.example"]}'
ctl close default
say "kill -TERM condfs"
kill -TERM "$pid"; wait "$pid"; pid=
echo "unmounted; socket removed: $([ -e "$sock" ] && echo no || echo yes)"
