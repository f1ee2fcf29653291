#!/usr/bin/env bash
# The README demo. Usage: examples/demo.sh path/to/condfs
set -euo pipefail
bin=${1:-bin/condfs}
here=$(cd "$(dirname "$0")" && pwd)
policy=$here/agent/config/policy.yaml

run() { echo "\$ condfs $*"; "$bin" "$@"; echo; }

run policy lint "$policy"
run policy eval --policy "$policy" --tool send_email --args '{"to": ["ann@acme.com", "bo@acme.com"]}'
run policy eval --policy "$policy" --tool send_email --args '{"to": ["ann@acme.com", "eve@evil.example"]}'
run policy eval --policy "$policy" --tool refund --args '{"amount": 900, "order_total": 1000}'
run policy eval --policy "$policy" --tool refund --args '{"amount": 900, "order_total": 1000}' --context discord:dm --context discord:dm:42 --context discord:channel:42
