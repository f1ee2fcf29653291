#!/usr/bin/env bash
# The cost of one command from an agent runtime, three ways in one run
# (docs/performance.md, "From a runtime's own process"): the Python
# client's session.run, condfs run, and bubblewrap with the same binds.
# Root; bubblewrap installed (apt-get install bubblewrap). Usage:
#   bench/clients/bench.sh [RUNS]        (after make build)
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-200}
bin=$PWD/bin/condfs
[ -x "$bin" ] || { echo "no bin/condfs: make build first" >&2; exit 2; }
command -v bwrap >/dev/null || { echo "no bwrap: apt-get install bubblewrap" >&2; exit 2; }
home=$(mktemp -d /tmp/condfs-bench-clients.XXXXXX)
mkdir -p "$home"/{config,blocks/conditional,memories,workspace,mnt}
printf '[sandbox]\nbinaries = ["/usr/bin/true"]\n' >"$home/config/conditions.toml"
printf 'version: 1\nroles:\n  default:\n    tools:\n      exec: {mode: allow}\n' >"$home/config/policy.yaml"
sock=$home/run/condfs.sock
"$bin" serve --root "$home" --socket "$sock" --log-level error --audit "$home/audit.log" &
daemon=$!
trap 'kill $daemon; wait $daemon; rm -rf "$home"' EXIT
for _ in $(seq 500); do [ -S "$sock" ] && break; sleep 0.01; done
"$bin" ctl --socket "$sock" open bench "$home/mnt/bench" --context internal >/dev/null
common=(--socket "$sock" --session bench --mount "$home/mnt/bench" --condfs "$bin")
# A first round of each, not counted (the daemon indexes the host's programs
# before its first run).
for via in client cli bwrap; do python3 bench/clients/runs.py --via $via -n 20 --quiet "${common[@]}"; done
for round in 1 2 3; do
  for via in client cli bwrap; do python3 bench/clients/runs.py --via $via -n "$n" "${common[@]}"; done
done
