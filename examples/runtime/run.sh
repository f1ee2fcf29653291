#!/usr/bin/env bash
# Starts condfs serve on the example agent's home (examples/agent) and runs
# the Python agent loop, then the TypeScript one, against it.
# Usage: examples/runtime/run.sh [path/to/condfs]   (as root: it mounts FUSE)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${1:-$here/../../bin/condfs}")
tmp=$(mktemp -d /tmp/condfs-runtime.XXXXXX)
export CONDFS_SOCKET=$tmp/run/condfs.sock CONDFS_BIN=$bin
"$bin" serve --root "$here/../agent" --socket "$CONDFS_SOCKET" --log-level warn 2>"$tmp/daemon.log" &
pid=$!
trap 'kill -TERM $pid; wait $pid || true; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do [ -S "$CONDFS_SOCKET" ] && break; sleep 0.05; done
[ -S "$CONDFS_SOCKET" ] || { cat "$tmp/daemon.log"; exit 1; }

echo "== Python (clients/python)"
python3 "$here/agent_loop.py" "$tmp/view-py"

echo
echo "== TypeScript (clients/typescript)"
cd "$here"
[ -d node_modules/@condfs/client/dist ] || npm install --no-audit --no-fund >/dev/null
npx tsc -p tsconfig.json
node dist/agent-loop.js "$tmp/view-ts"
